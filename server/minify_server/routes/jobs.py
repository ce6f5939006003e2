"""/v1/jobs: submit, list, status, events, artifacts, cancel."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from datetime import datetime
from pathlib import Path

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.responses import FileResponse, StreamingResponse
from pydantic import ValidationError
from redis.client import Pipeline
from starlette.concurrency import run_in_threadpool

from minify_client.models import CulpritState, JobCreated, JobLinks, JobList, JobSpec, JobState, JobStatus
from minify_client.specflags import describe_validation_error
from minify_server import queue
from minify_server.archive import (
    CodeInArchive,
    NotAnExportArchive,
    NotAProgram,
    check_export_archive,
    check_hlo_program,
    check_npz_file,
    check_torch_save_file,
)
from minify_server.auth import require_token
from minify_server.errors import ApiError
from minify_server.events import job_events
from minify_server.records import JobRecords, create_unless_identical, now_iso, ticket_keys, to_job_status
from minify_server.store import ArtifactStore, Blob, StorageFull, UnknownArtifact, UploadTooLarge
from minify_server.uploads import BadUpload, JobUpload, receive_job_upload

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=[Depends(require_token)])

_UPLOAD_FORM = {
    "requestBody": {
        "required": True,
        "content": {"multipart/form-data": {"schema": {
            "type": "object",
            "required": ["program", "spec"],
            "properties": {
                "program": {"type": "string", "format": "binary", "description": ".pt2 from torch.export.save"},
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
    fields = await _records(request).get(job_id) if len(job_id) <= 64 else None
    if fields is None:
        raise ApiError(404, f"no job {job_id!r}")
    status = to_job_status(fields)
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


def _parse_spec(upload: JobUpload, allowed_backends: str) -> JobSpec:
    if "spec" not in upload.texts:
        raise ApiError(400, "missing form field 'spec' (the JobSpec as JSON; '{}' for the defaults)")
    try:
        spec = JobSpec.model_validate_json(upload.texts["spec"])
    except ValidationError as error:
        raise ApiError(400, describe_validation_error(error),
                       detail=[{"loc": list(e["loc"]), "msg": e["msg"]} for e in error.errors()]) from error
    if ":" in spec.backend:
        module = spec.backend.split(":", 1)[0]
        prefixes = [prefix.strip() for prefix in allowed_backends.split(",") if prefix.strip()]
        if not any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes):
            raise ApiError(400, f"backend module {module!r} is not allowed on this service "
                                f"(MINIFY_ALLOWED_BACKENDS={allowed_backends!r})")
    return spec


def submission_digest(program_sha256: str, inputs_sha256: str | None, spec: JobSpec) -> str:
    """What makes two submissions identical: the program's bytes, the inputs' bytes and the spec as
    canonical JSON (defaults filled in, keys sorted), so `{}` and the defaults spelled out are one."""
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    text = f"program {program_sha256}\ninputs {inputs_sha256 or '-'}\nspec {canonical}"
    return hashlib.sha256(text.encode()).hexdigest()


def _is_true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _storage_full(error: StorageFull) -> ApiError:
    return ApiError(507, f"the server could not store the upload: its disk is full ({error}); nothing was "
                         "kept, retry once space is freed", detail={"cause": str(error)})


def _check_files(upload: JobUpload, allow_pickle: bool, program_format: str) -> None:
    if "program" not in upload.files:
        raise ApiError(400, "missing form field 'program' (a .pt2 file from torch.export.save)")
    name = upload.filenames.get("program") or ""
    if program_format != "pt2":
        _check_hlo_files(upload, name, program_format)
        return
    try:
        check_export_archive(upload.files["program"].path, allow_pickle=allow_pickle)
    except CodeInArchive as error:
        raise ApiError(415, f"program {name!r}: {error}") from error
    except NotAnExportArchive as error:
        if not _is_pickled_module(upload, allow_pickle):
            hint = ("" if allow_pickle else "; a GraphModule saved with torch.save is a pickle, accepted only where "
                    "the operator sets MINIFY_ALLOW_PICKLE=1: export it instead with torch.export.export + "
                    "torch.export.save")
            raise ApiError(415, f"program {name!r}: {error}{hint}") from error
    if "inputs" in upload.files:
        try:
            check_torch_save_file(upload.files["inputs"].path)
        except NotAnExportArchive as error:
            raise ApiError(415, f"inputs: {error}") from error


def _check_hlo_files(upload: JobUpload, name: str, program_format: str) -> None:
    """A StableHLO or HLO job: the program's container and an .npz of inputs, nothing parsed."""
    try:
        check_hlo_program(upload.files["program"].path, program_format)
    except NotAProgram as error:
        raise ApiError(415, f"program {name!r}: {error}") from error
    if "inputs" in upload.files:
        try:
            check_npz_file(upload.files["inputs"].path)
        except NotAProgram as error:
            raise ApiError(415, f"inputs: {error}") from error


def _is_pickled_module(upload: JobUpload, allow_pickle: bool) -> bool:
    """A torch.save'd GraphModule, where the operator allows them: only ever unpickled in a sandbox child."""
    if not allow_pickle:
        return False
    try:
        check_torch_save_file(upload.files["program"].path)
    except NotAnExportArchive:
        return False
    return True


@router.post("", status_code=201, response_model=JobCreated, openapi_extra=_UPLOAD_FORM,
             summary="Submit a failing program",
             responses={200: {"model": JobCreated, "description": "an identical submission's job (deduplicated)"},
                        507: {"description": "the server's disk is full; nothing was stored"}})
async def create_job(request: Request, response: Response,
                     force: bool = Query(False, description="a new job even for an identical submission"),
                     ) -> JobCreated:
    settings = request.app.state.settings
    store = _store(request)
    content_length = request.headers.get("content-length")
    if content_length and content_length.isdigit() and int(content_length) > settings.upload_limit_bytes:
        raise ApiError(413, f"upload of {content_length} bytes exceeds the limit of "
                            f"{settings.upload_limit_bytes} bytes")
    try:
        upload = await receive_job_upload(request.headers.get("content-type", ""), request.stream(), store,
                                          settings.upload_limit_bytes)
    except UploadTooLarge as error:
        raise ApiError(413, str(error)) from error
    except BadUpload as error:
        raise ApiError(400, str(error)) from error
    except StorageFull as error:
        raise _storage_full(error) from error
    try:
        spec = _parse_spec(upload, settings.allowed_backends)
        if "program" not in upload.files:
            raise ApiError(400, "missing form field 'program' (a .pt2 file from torch.export.save)")
    except ApiError:
        upload.discard()
        raise
    inputs = upload.files.get("inputs")
    digest = submission_digest(upload.files["program"].sha256, inputs.sha256 if inputs else None, spec)
    force = force or _is_true(upload.texts.get("force"))
    try:
        existing = None if force else await _records(request).existing(digest)
    except BaseException:
        upload.discard()
        raise
    if existing is not None:  # the same bytes passed the checks below when that job was submitted
        upload.discard()
        return await _deduplicated(request, response, spec, *existing)
    try:
        _check_files(upload, settings.allow_pickle, spec.program_format)
    except ApiError:
        upload.discard()
        raise
    try:
        blobs = await run_in_threadpool(_commit_all, store, upload)
    except StorageFull as error:
        raise _storage_full(error) from error
    job_id = uuid.uuid4().hex
    out_dir = store.out_dir(job_id)
    program_name = Path(upload.filenames.get("program") or "program.pt2").name
    fields = {
        "id": job_id, "status": JobState.queued.value, "spec": spec.model_dump_json(),
        "created_at": now_iso(), "attempts": "0", "program_name": program_name,
        "program_sha256": blobs["program"].sha256, "queue": spec.device_class, "content": digest,
        **({"inputs_sha256": blobs["inputs"].sha256} if "inputs" in blobs else {}),
    }
    ticket = {
        "job_id": job_id,
        "program": str(blobs["program"].path),
        "inputs": str(blobs["inputs"].path) if "inputs" in blobs else None,
        "out_dir": str(out_dir),
        "spec": spec.model_dump_json(),
        "keys": ticket_keys(job_id),
    }
    redis = request.app.state.sync_redis

    def enqueue(pipe: Pipeline) -> None:
        queue.enqueue(redis, job_id, spec, ticket, settings.job_retries, pipeline=pipe)

    # The record and its RQ job in one transaction (one fsync of Redis's append-only file, never a
    # record outside a queue), unless an identical submission made its job since the check above
    # (the blobs committed are that job's too: the same bytes).
    existing = await run_in_threadpool(create_unless_identical, redis, job_id, fields, force, enqueue)
    if existing is not None:
        return await _deduplicated(request, response, spec, *existing)
    warning = await _unserved_queue_warning(request, spec.device_class, None)
    return JobCreated(id=job_id, status=JobState.queued, links=_links(job_id, []),
                      warnings=[warning] if warning else [])


async def _deduplicated(request: Request, response: Response, spec: JobSpec, job_id: str,
                        status: JobState) -> JobCreated:
    """200: the job of an identical submission (queued, running or succeeded)."""
    response.status_code = 200
    warning = await _unserved_queue_warning(request, spec.device_class, None) if status is JobState.queued else None
    return JobCreated(id=job_id, status=status, links=_links(job_id, []), deduplicated=True,
                      warnings=[warning] if warning else [])


def _commit_all(store: ArtifactStore, upload: JobUpload) -> dict[str, Blob]:
    """Every uploaded file into the blob store, or none: on a full disk the blobs this upload created go."""
    blobs: dict[str, Blob] = {}
    try:
        for name, writer in upload.files.items():
            blobs[name] = store.commit(writer)
    except BaseException:
        upload.discard()
        for blob in blobs.values():
            if blob.new:
                blob.path.unlink(missing_ok=True)
        raise
    return blobs


@router.get("", response_model=JobList, summary="Jobs, newest first")
async def list_jobs(request: Request, offset: int = Query(0, ge=0),
                    limit: int = Query(50, ge=1, le=500),
                    status: JobState | None = Query(None, description="only jobs with this status")) -> JobList:
    rows, total = await _records(request).page(offset, limit, status)
    jobs = []
    for fields in rows:
        status = to_job_status(fields)
        status.links = _links(status.id, [])
        jobs.append(status)
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
    events = job_events(request.app.state.stream_redis, job_id, cursor, request.app.state.redis_outages)
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.get("/{job_id}/artifacts/{name}", summary="Download an artifact", response_class=FileResponse)
async def get_artifact(request: Request, job_id: str, name: str) -> FileResponse:
    status = await _job(request, job_id)
    if not status.status.finished:
        raise ApiError(404, f"job {job_id} is {status.status.value}; artifacts appear when it ends")
    try:
        path = await run_in_threadpool(_store(request).artifact, job_id, name)
    except UnknownArtifact as error:
        raise ApiError(404, str(error).strip("'\"")) from error
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
