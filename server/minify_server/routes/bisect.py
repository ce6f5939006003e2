"""/v1/jobs/{id}/bisect: bisect a succeeded job's repro across the torch releases of a worker's index."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from minify_contract import queue
from minify_contract.ledger import TicketKeys, record_fields, record_key
from minify_contract.models import Bisection, BisectRequest, JobState
from minify_server.auth import require_token
from minify_server.errors import ApiError

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=[Depends(require_token)])


@router.post("/{job_id}/bisect", response_model=Bisection, status_code=202,
             summary="Narrow the job's regression to the first bad torch release (installs the ones in between)")
async def start_bisect(request: Request, job_id: str, body: BisectRequest) -> Bisection:
    redis = request.app.state.redis
    record = await request.app.state.records.get(job_id)
    if record is None:
        raise ApiError(404, f"no job {job_id!r}")
    if record.status is not JobState.succeeded or record.result is None:
        raise ApiError(409, f"job {job_id} is {record.status.value}: only a succeeded job has a repro to bisect")
    if not await queue.live_workers(redis, queue.BISECT_QUEUE):
        raise ApiError(409, "no live worker can install torch releases (a worker bisects when it has "
                            "MINIFY_TORCH_INDEX)")
    report = record.result
    if report.bisect is not None and report.bisect.state == "running":
        raise ApiError(409, f"job {job_id} is already bisecting {report.bisect.good}..{report.bisect.bad}")
    bisection = Bisection(good=body.good, bad=body.bad)
    await redis.hset(record_key(job_id), mapping=record_fields(result=report.model_copy(update={"bisect": bisection})))
    ticket = {"job_id": job_id, "keys": TicketKeys.for_job(job_id).to_wire(),
              "out_dir": str(request.app.state.store.out_dir(job_id)), "request": body.model_dump()}
    await run_in_threadpool(queue.enqueue_bisect, request.app.state.sync_redis, ticket)
    return bisection
