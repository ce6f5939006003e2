"""The job ledger: the one place that spells the Redis keys of jobs and bugs, and how a job's
record, its events and its ticket are read and written. The server (minify_server/records.py,
async) and the worker (minify_worker/service/job.py, sync) both go through it, as rq's `job.py` is the one
place rq's jobs are kept; it imports neither FastAPI nor torch, so a worker imports it.

Keys (docs/service.md):
- `minify:job:<id>`: the job's record, a hash of `JobRecord`'s fields (`to_hash`, `from_hash`);
- `minify:job:<id>:events`: its ProgressEvents, a stream (`add_event`);
- `minify:job:<id>:cancel`: the cancel flag; `minify:job:<id>:versions`: the version phase's answers;
- `minify:job:<id>:write_mark`: the mark of the last write a worker made for the job (`write_for_attempt`);
- `minify:jobs`: every job by creation time; `minify:counters`: the service's counters;
- `minify:content:<digest>`: the job each distinct submission went to (deduplication);
- `minify:bugs`, `minify:bug:<id>`, `minify:bug:<id>:jobs`, `:versions`, `:retests`: the bug index
  (`add_to_bug_index` files a job; minify_server/bugs.py reads it);
- `minify:queues:served_at` and `minify:workers:torch`: what workers announce on every heartbeat.

Attempts: the record's `attempts` is the number of the job's current attempt, and a worker writes
for one attempt only (`write_for_attempt`): once the job was re-queued, or another attempt runs,
every write of the old one is refused, atomically in Redis. docs/service.md and docs/deploy.md
("Faults between machines") say what that guarantees.

The worker gets a job's keys in its ticket (`JobTicket.keys`, a `TicketKeys`), so a job queued by
a server writes where that server reads.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationInfo, field_validator
from redis import Redis
from redis.exceptions import WatchError

from minify_contract.bugs import bug_key
from minify_contract.config_schema import config_mistake
from minify_contract.models import CulpritState, JobSpec, JobState, JobStatus, Progress, ProgressEvent, Report

INDEX_KEY = "minify:jobs"
COUNTERS_KEY = "minify:counters"
BUGS_KEY = "minify:bugs"
# Queue name -> when a live worker last served it (epoch seconds), written on every heartbeat.
QUEUES_SERVED_KEY = "minify:queues:served_at"
# Worker name -> the torch installations it announced, as JSON (minify_worker/service/versions/phase.py).
WORKERS_TORCH_KEY = "minify:workers:torch"
# torch version -> the settings it accepts in JobSpec.config, as a worker with that torch published
# them at start (minify_contract.config_schema.ConfigSchema as JSON).
CONFIG_SCHEMAS_KEY = "minify:config:schemas"
EVENTS_MAXLEN = 10_000
CANCEL_TTL_S = 7 * 24 * 3600
# How long the mark of a worker's last write on a job (`write_mark_key`) is kept.
WRITE_MARK_TTL_S = 24 * 3600


def record_key(job_id: str) -> str:
    return f"minify:job:{job_id}"


def events_key(job_id: str) -> str:
    return f"minify:job:{job_id}:events"


def cancel_key(job_id: str) -> str:
    return f"minify:job:{job_id}:cancel"


def write_mark_key(record: str) -> str:
    """Where each write of a worker on the job with record key `record` leaves its mark: a write
    retried after its reply was lost (Redis restarted, the link cut) finds it and is not applied twice."""
    return f"{record}:write_mark"


def job_versions_key(job_id: str) -> str:
    """The version phase's answers for the job: torch version -> its VersionRun as JSON."""
    return f"minify:job:{job_id}:versions"


def content_key(digest: str) -> str:
    return f"minify:content:{digest}"


def bug_record_key(bug_id: str) -> str:
    return f"minify:bug:{bug_id}"


def bug_jobs_key(bug_id: str) -> str:
    return f"minify:bug:{bug_id}:jobs"


def bug_versions_key(bug_record: str) -> str:
    """Each torch version's latest run of a bug's repro; `bug_record` is the bug's record key
    (`bug_record_key`, or a ticket's `bug` template filled in)."""
    return f"{bug_record}:versions"


def bug_retests_key(bug_record: str) -> str:
    """Torch version -> when the server enqueued a re-test of the bug (`bug_record` as above)."""
    return f"{bug_record}:retests"


def now_iso() -> str:
    """A record's timestamps: UTC, ISO 8601."""
    return datetime.now(timezone.utc).isoformat()


def event_fields(event: ProgressEvent) -> dict[str, str]:
    """A stream entry: the SSE event type and the ProgressEvent as JSON."""
    return {"event": event.type, "data": event.model_dump_json(exclude_none=True)}


def add_event(redis: Any, events: str, event: ProgressEvent) -> Any:
    """Append `event` to the stream `events` (on a Redis client or pipeline, sync or async), trimmed
    to about EVENTS_MAXLEN entries."""
    return redis.xadd(events, event_fields(event), maxlen=EVENTS_MAXLEN, approximate=True)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _encode(value: object) -> str:
    """A field's value as the record stores it."""
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (str, int)):
        return str(value)
    raise TypeError(f"a job record holds no {type(value).__name__}")


class JobRecord(BaseModel):
    """A job's record (`minify:job:<id>`): the server creates it, the worker's job entry moves it
    on; each field is one hash field (text; the models as JSON, timestamps as ISO 8601)."""

    id: str
    status: JobState
    spec: JobSpec
    created_at: datetime
    attempts: int = 0
    program_name: str | None = None
    program_sha256: str | None = None
    queue: str | None = None
    content: str | None = None  # the submission's digest: its content key names this job
    inputs_sha256: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    worker: str | None = None
    reason: str | None = None
    progress: Progress | None = None
    result: Report | None = None
    culprit_state: CulpritState | None = None
    bug: str | None = None

    @field_validator("spec", "progress", "result", mode="before")
    @classmethod
    def _from_json(cls, value: object, info: ValidationInfo) -> object:
        model = {"spec": JobSpec, "progress": Progress, "result": Report}[info.field_name]
        return model.model_validate_json(value) if isinstance(value, (str, bytes)) else value

    def to_hash(self) -> dict[str, str]:
        """The hash fields, the unset ones left out."""
        return record_fields(**dict(self))

    @classmethod
    def from_hash(cls, fields: dict[Any, Any]) -> JobRecord:
        """The record from its hash (HGETALL, text or bytes); an empty field counts as unset."""
        values = {_text(name): _text(value) for name, value in fields.items()}
        return cls.model_validate({name: value for name, value in values.items()
                                   if name in cls.model_fields and value != ""})

    def to_job_status(self) -> JobStatus:
        """What `GET /v1/jobs/{id}` answers (without its links and warnings)."""
        return JobStatus(id=self.id, status=self.status, spec=self.spec, created_at=self.created_at,
                         started_at=self.started_at, finished_at=self.finished_at,
                         progress=self.progress or Progress(), result=self.result, reason=self.reason,
                         worker=self.worker, program_name=self.program_name, attempts=self.attempts, bug=self.bug,
                         culprit_state=self.culprit_state)


def record_fields(**changes: object) -> dict[str, str]:
    """Hash fields that set `changes` (names of JobRecord's fields) on a record, encoded as
    `JobRecord.to_hash` encodes them: what a partial write (HSET ... mapping=) sends. A None
    leaves its field out."""
    unknown = set(changes) - set(JobRecord.model_fields)
    if unknown:
        raise ValueError(f"not fields of a job record: {sorted(unknown)}")
    return {name: _encode(value) for name, value in changes.items() if value is not None}


class JobFootprint(BaseModel):
    """What the retention sweep reads of a record (HMGET of `FIELDS`, the result left unread):
    whether and when it ended, its bug, its content key and the uploads it refers to."""

    status: JobState | None = None
    created_at: datetime | None = None
    finished_at: datetime | None = None
    bug: str | None = None
    content: str | None = None
    program_sha256: str | None = None
    inputs_sha256: str | None = None

    @classmethod
    def fields(cls) -> list[str]:
        return list(cls.model_fields)

    @classmethod
    def from_values(cls, values: list[Any]) -> JobFootprint:
        """From HMGET's answer to `fields()`, in that order."""
        return cls.model_validate({name: _text(value) for name, value in zip(cls.fields(), values, strict=True)
                                   if value is not None and value != ""})

    def ended_before(self, cutoff: float) -> bool:
        """It ended (finished_at, else created_at) before `cutoff`, epoch seconds."""
        if self.status is None or not self.status.finished:
            return False
        when = self.finished_at or self.created_at
        return when is not None and when.timestamp() < cutoff

    @property
    def uploads(self) -> set[str]:
        """The sha256 of every blob the job refers to."""
        return {sha for sha in (self.program_sha256, self.inputs_sha256) if sha}


class TicketKeys(BaseModel):
    """The keys a job's entry writes, as its ticket names them. `bug` and `bug_jobs` are templates
    of `{bug}` (the bug id); a ticket of a server older than the bug index has none of the three."""

    record: str
    events: str
    cancel: str
    counters: str
    bugs: str | None = None
    bug: str | None = None
    bug_jobs: str | None = None

    @classmethod
    def for_job(cls, job_id: str) -> TicketKeys:
        return cls(record=record_key(job_id), events=events_key(job_id), cancel=cancel_key(job_id),
                   counters=COUNTERS_KEY, bugs=BUGS_KEY, bug=bug_record_key("{bug}"), bug_jobs=bug_jobs_key("{bug}"))

    @property
    def has_bug_index(self) -> bool:
        return self.bugs is not None and self.bug is not None and self.bug_jobs is not None

    def bug_record(self, bug_id: str) -> str:
        assert self.bug is not None, "a ticket without bug keys"
        return self.bug.format(bug=bug_id)

    def to_wire(self) -> dict[str, str]:
        return self.model_dump(exclude_none=True)


class JobTicket(BaseModel):
    """What the server enqueues for a job (`minify_worker.service.job.run_job`'s argument, a plain dict on
    the wire): the uploaded program and inputs, the result folder, the spec and the keys; and which
    attempt of the job it runs (1, or n + 1 where attempt n was lost and re-queued) and how many
    re-runs the job may have. Tickets of servers older than attempts carry neither (None)."""

    job_id: str
    program: Path
    inputs: Path | None
    out_dir: Path
    spec: JobSpec
    keys: TicketKeys
    attempt: int | None = None
    retries: int | None = None

    @field_validator("spec", mode="before")
    @classmethod
    def _spec_from_json(cls, value: object) -> object:
        return JobSpec.model_validate_json(value) if isinstance(value, (str, bytes)) else value

    def to_wire(self) -> dict[str, Any]:
        wire = {"job_id": self.job_id, "program": str(self.program),
                "inputs": str(self.inputs) if self.inputs is not None else None, "out_dir": str(self.out_dir),
                "spec": self.spec.model_dump_json(), "keys": self.keys.to_wire()}
        attempts = {"attempt": self.attempt, "retries": self.retries}
        return {**wire, **{name: value for name, value in attempts.items() if value is not None}}

    @classmethod
    def from_wire(cls, ticket: dict[str, Any]) -> JobTicket:
        return cls.model_validate(ticket)


def add_to_bug_index(pipe: Any, keys: TicketKeys, job_id: str, report: Report, finished_at: str) -> str | None:
    """Queue on `pipe` (a Redis transaction, sync or async) the writes that file a succeeded job under
    its bug (minify_contract.bugs.bug_key): the bug's record (the first job filed stays its
    representative), its jobs by finish time, the bugs by last seen, and `bug` on the job's record.
    Returns the bug id; None (nothing queued) for a report without a signature or a graph shape
    hash, a failure the job's own config caused (torch refusing a value it was given: the user's
    mistake, not a compiler bug), or keys without the bug index."""
    if not report.signature or not report.graph_shape_hash or not keys.has_bug_index:
        return None
    if config_mistake(report.signature, report.config) is not None:
        return None
    assert keys.bugs is not None and keys.bug_jobs is not None
    bug_id = bug_key(report.signature, report.graph_shape_hash)
    bug = keys.bug_record(bug_id)
    first = {"id": bug_id, "signature": report.signature, "graph_shape_hash": report.graph_shape_hash,
             "failure_kind": report.failure_kind or "", "backend": report.backend, "device": report.device,
             "first_seen": finished_at, "representative": job_id}
    for name, value in first.items():
        pipe.hsetnx(bug, name, value)
    pipe.hset(bug, "last_seen", finished_at)
    seen = datetime.fromisoformat(finished_at).timestamp()
    pipe.zadd(keys.bug_jobs.format(bug=bug_id), {job_id: seen})
    pipe.zadd(keys.bugs, {bug_id: seen})
    pipe.hset(keys.record, mapping=record_fields(bug=bug_id))
    return bug_id


class AttemptSuperseded(Exception):
    """A write for an attempt that is no longer the job's current one (it was re-queued, another
    attempt runs, or the job ended): refused, nothing written."""


def write_for_attempt(redis: Redis, record: str, attempt: int | None, statuses: Collection[JobState], mark: str,
                      queue_writes: Callable[[Any, int], object],
                      before_commit: Callable[[], None] | None = None, worker: str | None = None) -> int:
    """Apply the writes `queue_writes(pipe, attempts)` queues, in one transaction with the check that
    they belong to the job's current attempt: the record's `attempts` is `attempt` (None: any) and
    its status one of `statuses`, and, given `worker`, the record names it (a Redis that lost its last
    second of writes in a crash can hand one attempt to two workers). WATCH/MULTI on the record, so
    no re-queue or start can slip in between the check and the writes. `before_commit` runs once
    the check passed, before the transaction. `mark` (unique to this write) is left beside the
    record (`write_mark_key`): a retry of a write that was applied but whose reply was lost finds
    it and applies nothing. Returns the record's `attempts`; raises AttemptSuperseded when refused."""
    mark_key = write_mark_key(record)
    with redis.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(record, mark_key)
                status, attempts, running_on = (_text(value) if value is not None else None
                                                for value in pipe.hmget(record, ["status", "attempts", "worker"]))
                current = int(attempts or 0)
                written = pipe.get(mark_key)
                if written is not None and _text(written) == mark:
                    pipe.unwatch()
                    return current
                if (status not in {state.value for state in statuses} or (attempt is not None and current != attempt)
                        or (worker is not None and running_on != worker)):
                    pipe.unwatch()
                    raise AttemptSuperseded(f"{record}: attempt {attempt} of {worker or 'a worker'} writes, the record "
                                            f"says attempt {current} of {running_on}, {status or 'gone'}")
                if before_commit is not None:
                    before_commit()
                pipe.multi()
                queue_writes(pipe, current)
                pipe.set(mark_key, mark, ex=WRITE_MARK_TTL_S)
                pipe.execute()
                return current
            except WatchError:
                continue
