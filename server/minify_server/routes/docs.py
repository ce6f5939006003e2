"""The API's documentation pages, /docs (Swagger UI) and /redoc (ReDoc), from files installed with
the package (static/vendor/): no CDN, so they work on the offline machines many GPU clusters are.

A Content-Security-Policy keeps the pages on this server: ReDoc's bundle shows a logo from
cdn.redoc.ly, which the policy refuses (the logo hides itself when it cannot load)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse

VENDOR = "/static/vendor"
SWAGGER_UI = f"{VENDOR}/swagger-ui"
REDOC = f"{VENDOR}/redoc"
# The pages' own inline script starts the UI; Swagger UI draws icons from data: URIs; ReDoc's
# search runs in a worker made from a blob.
CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
                           "img-src 'self' data:; worker-src 'self' blob:; connect-src 'self'")

router = APIRouter(include_in_schema=False)


def _root(request: Request) -> str:
    """The prefix the app is mounted under (a proxy's root_path), as FastAPI's own docs pages use it."""
    return request.scope.get("root_path", "").rstrip("/")


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    root = _root(request)
    page = get_swagger_ui_html(
        openapi_url=f"{root}{request.app.openapi_url}",
        title=f"{request.app.title}: API",
        swagger_js_url=f"{root}{SWAGGER_UI}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{SWAGGER_UI}/swagger-ui.css",
        swagger_favicon_url=f"{root}{SWAGGER_UI}/favicon-32x32.png",
        oauth2_redirect_url=None,
        # Swagger UI would send the schema to validator.swagger.io for a badge.
        swagger_ui_parameters={"validatorUrl": None},
    )
    page.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return page


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    root = _root(request)
    page = get_redoc_html(
        openapi_url=f"{root}{request.app.openapi_url}",
        title=f"{request.app.title}: API",
        redoc_js_url=f"{root}{REDOC}/redoc.standalone.js",
        redoc_favicon_url=f"{root}{SWAGGER_UI}/favicon-32x32.png",
        with_google_fonts=False,
    )
    page.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return page
