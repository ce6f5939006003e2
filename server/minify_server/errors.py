"""Every 4xx/5xx is an ErrorResponse: a sentence saying what went wrong, and details when useful."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from minify_contract.models import ErrorResponse
from minify_server.connections import RETRY_AFTER_S, UNAVAILABLE

log = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(self, status_code: int, error: str, detail: Any | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(error)
        self.status_code = status_code
        self.error = error
        self.detail = detail
        self.headers = headers


def error_response(status_code: int, error: str, detail: Any | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    body = ErrorResponse(error=error, detail=detail).model_dump(exclude_none=True)
    return JSONResponse(body, status_code=status_code, headers=headers)


def _describe(errors: list[dict[str, Any]]) -> str:
    parts = []
    for item in errors:
        where = ".".join(str(part) for part in item.get("loc", ()) if part not in ("body", "query", "path"))
        parts.append(f"{where or 'request'}: {item.get('msg', 'invalid')}")
    return "; ".join(parts)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status_code, exc.error, exc.detail, exc.headers)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        if exc.status_code == 404 and message == "Not Found":
            message = f"no route {request.method} {request.url.path}"
        return error_response(exc.status_code, message, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [dict(item) for item in exc.errors()]
        return error_response(422, f"invalid request: {_describe(errors)}")

    async def _redis_unavailable(request: Request, exc: Exception) -> JSONResponse:
        # Handled here, not by the catch-all below: that one re-raises, and the server then drops
        # the (keep-alive) connection and logs a traceback per request.
        request.app.state.redis_outages.failed(exc)
        return error_response(503, "the job store (Redis) is unavailable; retry shortly",
                              headers={"Retry-After": str(RETRY_AFTER_S)})

    for unavailable in UNAVAILABLE:
        app.add_exception_handler(unavailable, _redis_unavailable)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, f"internal server error: {type(exc).__name__}")
