"""/v1/workers: the live workers, and the torch versions each holds for the version phase."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from minify_contract import queue
from minify_contract.models import WorkerList
from minify_server.auth import require_token

router = APIRouter(prefix="/v1/workers", tags=["workers"], dependencies=[Depends(require_token)])


@router.get("", response_model=WorkerList, summary="Live workers, their queues and the torch versions they hold")
async def list_workers(request: Request) -> WorkerList:
    workers = await queue.worker_infos(request.app.state.redis)
    return WorkerList(workers=workers, versions=queue.torch_versions_held(workers))
