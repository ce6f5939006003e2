"""/v1/bugs: succeeded jobs grouped by root-cause signature and minimal graph shape."""

from __future__ import annotations

import re
from typing import Literal

from fastapi import APIRouter, Depends, Query, Request

from minify_contract.models import Bug, BugCloseRequest, BugList, BugReopenRequest
from minify_server.auth import require_token, who
from minify_server.bugs import BugIndex, BugStateError
from minify_server.errors import ApiError

router = APIRouter(prefix="/v1/bugs", tags=["bugs"], dependencies=[Depends(require_token)])

_BUG_ID = re.compile(r"^[0-9a-f]{1,64}$")


def _bugs(request: Request) -> BugIndex:
    return request.app.state.bugs


@router.get("", response_model=BugList, summary="Bugs, most recently seen first")
async def list_bugs(request: Request, offset: int = Query(0, ge=0), limit: int = Query(50, ge=1, le=500),
                    status: Literal["open", "fixed", "closed"] | None = Query(
                        None, description="open, fixed (a newer torch passes its repro), or closed (by hand)"),
                    q: str | None = Query(None, max_length=200, description="only bugs whose id, signature, failure "
                                          "kind, backend or device hold this text (any case)")) -> BugList:
    bugs, total = await _bugs(request).page(offset, limit, status, q)
    return BugList(bugs=bugs, total=total, offset=offset, limit=limit)


@router.get("/{bug_id}", response_model=Bug, summary="A bug: its signature, jobs and representative repro")
async def get_bug(request: Request, bug_id: str) -> Bug:
    bug = await _bugs(request).get(bug_id) if _BUG_ID.match(bug_id) else None
    if bug is None:
        raise ApiError(404, f"no bug {bug_id!r}")
    return bug


def _changed(bug: Bug | None, bug_id: str) -> Bug:
    if bug is None:
        raise ApiError(404, f"no bug {bug_id!r}")
    return bug


@router.post("/{bug_id}/close", response_model=Bug, summary="Close a bug by hand, saying why",
             responses={409: {"description": "it is closed already"}})
async def close_bug(request: Request, bug_id: str, body: BugCloseRequest) -> Bug:
    """Who closes it is the token's name on a server with tokens, else `by` (or `anonymous`). A bug
    closed as `fixed` is reopened (regressed) by the next job that finds it; one closed as
    `wont_fix` or `not_a_bug` stays closed, its new jobs counted in `jobs_since_closed`."""
    if not _BUG_ID.match(bug_id):
        raise ApiError(404, f"no bug {bug_id!r}")
    try:
        return _changed(await _bugs(request).close(bug_id, body.reason.strip(), body.resolution,
                                                   who(request, body.by)), bug_id)
    except BugStateError as error:
        raise ApiError(409, str(error)) from None


@router.post("/{bug_id}/reopen", response_model=Bug, summary="Reopen a bug closed by hand, saying why",
             responses={409: {"description": "it is not closed"}})
async def reopen_bug(request: Request, bug_id: str, body: BugReopenRequest) -> Bug:
    if not _BUG_ID.match(bug_id):
        raise ApiError(404, f"no bug {bug_id!r}")
    try:
        return _changed(await _bugs(request).reopen(bug_id, body.reason.strip(), who(request, body.by)), bug_id)
    except BugStateError as error:
        raise ApiError(409, str(error)) from None
