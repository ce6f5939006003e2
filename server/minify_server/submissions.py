"""Submissions: a `POST /v1/jobs` body becomes a job, or the job of an identical submission.

The route (routes/jobs.py) hands over the request's body and headers and answers what comes back;
this module receives the upload into the store, validates the spec, looks for an identical
submission's job (the content key), checks the files, commits them and creates the job's record
and RQ job in one transaction (records.create_unless_identical). What it refuses it raises as
ApiError (the route's 400, 413, 415, 422, 507), leaving nothing behind.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from pydantic import ValidationError
from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.client import Pipeline
from starlette.concurrency import run_in_threadpool

from minify_contract import queue
from minify_contract.config_schema import config_problems
from minify_contract.ledger import JobRecord, JobTicket, TicketKeys
from minify_contract.models import JobSpec, JobState
from minify_contract.specflags import describe_validation_error
from minify_server.archive import (
    CodeInArchive,
    NotAnExportArchive,
    NotAProgram,
    check_export_archive,
    check_hlo_program,
    check_npz_file,
    check_program_json,
    check_torch_save_file,
    is_pickle_file,
)
from minify_server.config import Settings
from minify_server.errors import ApiError
from minify_server.records import JobRecords, create_unless_identical
from minify_server.store import ArtifactStore, Blob, StorageFull, UploadTooLarge
from minify_server.uploads import BadUpload, JobUpload, receive_job_upload


@dataclass(frozen=True)
class Submitted:
    """The job a submission went to: a new one, or (`deduplicated`) an identical submission's."""

    job_id: str
    status: JobState
    queue: str  # the spec's device class
    deduplicated: bool


async def submit(content_type: str, content_length: str | None, body: AsyncIterator[bytes], force: bool,
                 settings: Settings, store: ArtifactStore, records: JobRecords, sync_redis: Redis) -> Submitted:
    """Turn the multipart `body` into a job. `force` (or the form's `force` field) makes a new job even
    when an identical submission's job is queued, running or succeeded."""
    if content_length and content_length.isdigit() and int(content_length) > settings.upload_limit_bytes:
        raise ApiError(413, f"upload of {content_length} bytes exceeds the limit of "
                            f"{settings.upload_limit_bytes} bytes")
    try:
        upload = await receive_job_upload(content_type, body, store, settings.upload_limit_bytes)
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
        await check_config(spec, records.redis)
    except ApiError:
        upload.discard()
        raise
    inputs = upload.files.get("inputs")
    digest = submission_digest(upload.files["program"].sha256, inputs.sha256 if inputs else None, spec)
    force = force or _is_true(upload.texts.get("force"))
    try:
        existing = None if force else await records.existing(digest)
    except BaseException:
        upload.discard()
        raise
    if existing is not None:  # the same bytes passed the checks below when that job was submitted
        upload.discard()
        return Submitted(existing[0], existing[1], spec.device_class, deduplicated=True)
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
    record = JobRecord(
        id=job_id, status=JobState.queued, spec=spec, created_at=datetime.now(timezone.utc), attempts=0,
        program_name=Path(upload.filenames.get("program") or "program.pt2").name,
        program_sha256=blobs["program"].sha256, queue=spec.device_class, content=digest,
        inputs_sha256=blobs["inputs"].sha256 if "inputs" in blobs else None,
    )
    ticket = JobTicket(job_id=job_id, program=blobs["program"].path,
                       inputs=blobs["inputs"].path if "inputs" in blobs else None, out_dir=store.out_dir(job_id),
                       spec=spec, keys=TicketKeys.for_job(job_id))

    def enqueue(pipe: Pipeline) -> None:
        queue.enqueue(sync_redis, ticket, settings.job_retries, pipeline=pipe)

    # The record and its RQ job in one transaction (one fsync of Redis's append-only file, never a
    # record outside a queue), unless an identical submission made its job since the check above
    # (the blobs committed are that job's too: the same bytes).
    existing = await run_in_threadpool(create_unless_identical, sync_redis, record, force, enqueue)
    if existing is not None:
        return Submitted(existing[0], existing[1], spec.device_class, deduplicated=True)
    return Submitted(job_id, JobState.queued, spec.device_class, deduplicated=False)


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


async def check_config(spec: JobSpec, redis: AsyncRedis) -> None:
    """A 422 naming each config key the live workers' torch does not take, and what it takes."""
    if not spec.config:
        return
    for schema in await queue.config_schemas(redis):
        if problems := config_problems(spec.config, schema):
            raise ApiError(422, "; ".join(problems), detail={"config": problems, "torch": schema.torch})


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
    if program_format == "fx_json":
        _check_program_json_files(upload, name)
        return
    if program_format != "pt2":
        _check_hlo_files(upload, name, program_format)
        return
    try:
        check_export_archive(upload.files["program"].path, allow_pickle=allow_pickle)
    except CodeInArchive as error:
        raise ApiError(415, f"program {name!r}: {error}") from error
    except NotAnExportArchive as error:
        if not _is_pickled_module(upload, allow_pickle):
            pickled = is_pickle_file(upload.files["program"].path)
            hint = ("; a GraphModule saved with torch.save is a pickle, accepted only where the operator sets "
                    "MINIFY_ALLOW_PICKLE=1: export it instead with torch.export.export + torch.export.save"
                    if pickled and not allow_pickle else "")
            raise ApiError(415, f"program {name!r}: {error}{hint}") from error
    if "inputs" in upload.files:
        try:
            check_torch_save_file(upload.files["inputs"].path)
        except NotAnExportArchive as error:
            raise ApiError(415, f"inputs: {error}") from error


def _check_program_json_files(upload: JobUpload, name: str) -> None:
    """A program.json job: the document checked without torch, and its values, which it cannot run
    without, a torch.save file (never unpickled here)."""
    try:
        check_program_json(upload.files["program"].path)
    except NotAProgram as error:
        raise ApiError(415, f"program {name!r}: {error}") from error
    if "inputs" not in upload.files:
        raise ApiError(400, f"program {name!r} is a program.json: it needs its inputs file (every placeholder's "
                            "value by name, the capture's inputs.pt)")
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
