"""/v1/jobs: submit, list, status, events, artifacts, cancel."""

from __future__ import annotations

import time
from datetime import datetime

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.responses import FileResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from minify_contract import queue
from minify_contract.models import CulpritState, JobCreated, JobLinks, JobList, JobLog, JobState, JobStatus
from minify_server import submissions
from minify_server.auth import require_token
from minify_server.errors import ApiError
from minify_server.events import job_events
from minify_server.records import JobRecords
from minify_server.store import ArtifactStore, UnknownArtifact

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=[Depends(require_token)])

_UPLOAD_FORM = {
    "requestBody": {
        "required": True,
        "content": {"multipart/form-data": {"schema": {
            "type": "object",
            "required": ["program", "spec"],
            "properties": {
                "program": {"type": "string", "format": "binary",
                            "description": ".pt2 from torch.export.save, or program.json (program_format fx_json)"},
                "inputs": {"type": "string", "format": "binary", "description": "optional .pt from torch.save"},
                "spec": {"type": "string", "description": "the JobSpec as JSON"},
                "force": {"type": "string", "description": "'true': a new job even when an identical "
                                                           "submission's job is queued, running or succeeded"},
            },
        }}},
    }
}


def _store(request: Request) -> ArtifactStore:
    return request.app.state.store


def _records(request: Request) -> JobRecords:
    return request.app.state.records


def _links(job_id: str, artifacts: list[str]) -> JobLinks:
    base = f"/v1/jobs/{job_id}"
    return JobLinks(self=base, events=f"{base}/events",
                    artifacts={name: f"{base}/artifacts/{name}" for name in artifacts},
                    dashboard=f"/?job={job_id}")


async def _job(request: Request, job_id: str) -> JobStatus:
    record = await _records(request).get(job_id) if len(job_id) <= 64 else None
    if record is None:
        raise ApiError(404, f"no job {job_id!r}")
    status = record.to_job_status()
    artifacts = _store(request).available(job_id) if status.status.finished else []
    status.links = _links(job_id, artifacts)
    if status.status is JobState.queued:
        warning = await _unserved_queue_warning(request, status.spec.device_class, status.created_at)
        status.warnings = [warning] if warning else []
    return status


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{max(0, int(seconds))} s"
    if seconds < 2 * 3600:
        return f"{int(seconds // 60)} minutes"
    return f"{seconds / 3600:.1f} hours"


# How long the routes trust a count of live workers: heartbeats come every 10 s, and a status read of
# every queued job (and every submission) would otherwise cost two more Redis round trips.
LIVE_WORKERS_TTL_S = 1.0


async def _live_workers(request: Request, queue_name: str) -> int:
    """`queue.live_workers`, remembered for LIVE_WORKERS_TTL_S."""
    cache: dict[str, tuple[float, int]] | None = getattr(request.app.state, "live_workers", None)
    if cache is None:
        cache = request.app.state.live_workers = {}
    expires, count = cache.get(queue_name, (0.0, 0))
    if time.monotonic() >= expires:
        count = await queue.live_workers(request.app.state.redis, queue_name)
        cache[queue_name] = (time.monotonic() + LIVE_WORKERS_TTL_S, count)
    return count


async def _unserved_queue_warning(request: Request, queue_name: str, queued_at: datetime | None) -> str | None:
    """Why a queued job is not running: no live worker serves its queue (since when, for a job that waits)."""
    if await _live_workers(request, queue_name):
        return None
    if queued_at is None:
        return f"no worker is serving the {queue_name} queue; the job waits until one starts"
    served_at = await _records(request).queue_served_at(queue_name)
    idle_s = time.time() - (served_at if served_at is not None else queued_at.timestamp())
    return f"no worker has served the {queue_name} queue for {_duration(idle_s)}; the job waits until one starts"


@router.post("", status_code=201, response_model=JobCreated, openapi_extra=_UPLOAD_FORM,
             summary="Submit a failing program",
             responses={200: {"model": JobCreated, "description": "an identical submission's job (deduplicated)"},
                        507: {"description": "the server's disk is full; nothing was stored"}})
async def create_job(request: Request, response: Response,
                     force: bool = Query(False, description="a new job even for an identical submission"),
                     ) -> JobCreated:
    submitted = await submissions.submit(
        request.headers.get("content-type", ""), request.headers.get("content-length"), request.stream(), force,
        request.app.state.settings, _store(request), _records(request), request.app.state.sync_redis)
    if submitted.deduplicated:
        response.status_code = 200
    queued = submitted.status is JobState.queued
    warning = await _unserved_queue_warning(request, submitted.queue, None) if queued else None
    return JobCreated(id=submitted.job_id, status=submitted.status, links=_links(submitted.job_id, []),
                      deduplicated=submitted.deduplicated, warnings=[warning] if warning else [])


@router.get("", response_model=JobList, summary="Jobs, newest first")
async def list_jobs(request: Request, offset: int = Query(0, ge=0),
                    limit: int = Query(50, ge=1, le=500),
                    status: JobState | None = Query(None, description="only jobs with this status"),
                    q: str | None = Query(None, max_length=200, description="only jobs whose id, program name, "
                                          "spec, reason or signature hold this text (any case)")) -> JobList:
    records, total = await _records(request).page(offset, limit, status, q)
    jobs = []
    for record in records:
        job = record.to_job_status()
        job.links = _links(job.id, [])
        jobs.append(job)
    return JobList(jobs=jobs, total=total, offset=offset, limit=limit)


@router.get("/{job_id}", response_model=JobStatus, summary="A job's status, progress and result")
async def get_job(request: Request, job_id: str) -> JobStatus:
    return await _job(request, job_id)


@router.get("/{job_id}/events", summary="Server-Sent Events: progress, status, log, culprit; ends with the job "
                                      "(a succeeded job's with its culprit phase)",
            response_class=StreamingResponse)
async def job_event_stream(request: Request, job_id: str,
                           last_event_id: str | None = Header(default=None)) -> StreamingResponse:
    await _job(request, job_id)
    cursor = last_event_id or request.query_params.get("last_event_id")
    events = job_events(request.app.state.stream_redis, job_id, cursor, request.app.state.redis_outages,
                        request.app.state.stopping)
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.get("/{job_id}/log", response_model=JobLog,
            summary="The job's own log: what the worker logged while it ran the job, every attempt")
async def get_job_log(request: Request, job_id: str,
                      tail: int = Query(200, ge=1, le=5000, description="the last this many lines")) -> JobLog:
    await _job(request, job_id)
    lines, more, size = await run_in_threadpool(_store(request).job_log, job_id, tail)
    return JobLog(id=job_id, lines=lines, more=more, size_bytes=size)


@router.get("/{job_id}/artifacts/{name}", summary="Download an artifact", response_class=FileResponse)
async def get_artifact(request: Request, job_id: str, name: str) -> FileResponse:
    status = await _job(request, job_id)
    if not status.status.finished:
        raise ApiError(404, f"job {job_id} is {status.status.value}; artifacts appear when it ends")
    try:
        path = await run_in_threadpool(_store(request).artifact, job_id, name)
    except UnknownArtifact as error:
        raise ApiError(404, str(error)) from error
    media_type = "text/x-python" if name.endswith(".py") else (
        "application/json" if name.endswith(".json") else "application/octet-stream")
    return FileResponse(path, media_type=media_type, filename=name)


@router.delete("/{job_id}", status_code=202, response_model=JobStatus,
               summary="Cancel: a queued job at once, a running one within seconds; a succeeded job's "
                       "culprit phase (culprit_state running) stops, the job stays succeeded")
async def cancel_job(request: Request, job_id: str) -> JobStatus:
    status = await _job(request, job_id)
    if status.status is JobState.succeeded and status.culprit_state is CulpritState.running:
        await _records(request).request_cancel(job_id)
        return status
    if status.status.finished:
        if status.status is JobState.cancelled:
            return status
        raise ApiError(409, f"job {job_id} already ended: {status.status.value}")
    if await _records(request).request_cancel(job_id):
        await run_in_threadpool(queue.dequeue, request.app.state.sync_redis, job_id)
    return await _job(request, job_id)
