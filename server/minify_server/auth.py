"""Bearer tokens on every /v1 route when MINIFY_TOKENS is set (`?token=` too, for EventSource).

An entry `NAME:TOKEN` of MINIFY_TOKENS names the token's holder (`alice:3f9c...`); a bare token is
`token N`, its place in the list from 1. The name is who a request was (`who`): a bug closed or
reopened records it.
"""

from __future__ import annotations

import hmac
import re

from fastapi import Request

from minify_server.errors import ApiError

_NAMED = re.compile(r"^([A-Za-z0-9_.@+-]{1,64}):(.+)$")
ANONYMOUS = "anonymous"


def named_tokens(entries: list[str]) -> list[tuple[str, str]]:
    """(name, token) of each MINIFY_TOKENS entry."""
    named = []
    for index, entry in enumerate(entries, start=1):
        match = _NAMED.match(entry)
        named.append((match.group(1), match.group(2)) if match else (f"token {index}", entry))
    return named


async def require_token(request: Request) -> None:
    tokens: list[str] = request.app.state.settings.tokens
    request.state.user = None
    if not tokens:
        return
    header = request.headers.get("authorization", "")
    scheme, _, credential = header.partition(" ")
    if scheme.lower() != "bearer" or not credential:
        credential = request.query_params.get("token", "")
    if not credential:
        raise ApiError(401, "missing token: send 'Authorization: Bearer <token>' (or ?token= for event streams)",
                       headers={"WWW-Authenticate": "Bearer"})
    offered = credential.strip().encode()
    for name, token in named_tokens(tokens):
        if hmac.compare_digest(offered, token.encode()):
            request.state.user = name
            return
    raise ApiError(401, "invalid token", headers={"WWW-Authenticate": "Bearer"})


def who(request: Request, claimed: str | None) -> str:
    """Who made the request: the token's name on a server with tokens (what the request claims does
    not count there), else the name it sends, else `anonymous`."""
    user = getattr(request.state, "user", None)
    if user:
        return user
    return (claimed or "").strip() or ANONYMOUS
