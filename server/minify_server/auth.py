"""Bearer tokens on every /v1 route when MINIFY_TOKENS is set (`?token=` too, for EventSource)."""

from __future__ import annotations

import hmac

from fastapi import Request

from minify_server.errors import ApiError


async def require_token(request: Request) -> None:
    tokens: list[str] = request.app.state.settings.tokens
    if not tokens:
        return
    header = request.headers.get("authorization", "")
    scheme, _, credential = header.partition(" ")
    if scheme.lower() != "bearer" or not credential:
        credential = request.query_params.get("token", "")
    if not credential:
        raise ApiError(401, "missing token: send 'Authorization: Bearer <token>' (or ?token= for event streams)",
                       headers={"WWW-Authenticate": "Bearer"})
    if not any(hmac.compare_digest(credential.strip().encode(), token.encode()) for token in tokens):
        raise ApiError(401, "invalid token", headers={"WWW-Authenticate": "Bearer"})
