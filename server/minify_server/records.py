"""Job records in Redis: the layout the server reads and the worker's job entry writes.

One hash per job (`minify:job:<id>`), one stream of ProgressEvents per job
(`minify:job:<id>:events`), a cancel flag (`minify:job:<id>:cancel`), a sorted set of all jobs
by creation time (`minify:jobs`), a hash of counters (`minify:counters`), the job each distinct
submission went to (`minify:content:<digest>`, deduplication) and the bug index (`minify:bugs`,
`minify:bug:<id>`, `minify:bug:<id>:jobs`; minify_server/bugs.py reads it). The worker gets the
key names in the job's ticket (ticket_keys), so this module is the one place they are spelled;
the exception is `minify:queues:served_at` (queue name → when a live worker last served it, epoch
seconds), which workers write on every heartbeat, outside any job, and which
minify_worker/rqworker.py spells too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from redis import Redis as SyncRedis
from redis.asyncio import Redis
from redis.client import Pipeline as SyncPipeline
from redis.exceptions import WatchError

from minify_client.models import JobSpec, JobState, JobStatus, ProgressEvent, Report

INDEX_KEY = "minify:jobs"
COUNTERS_KEY = "minify:counters"
QUEUES_SERVED_KEY = "minify:queues:served_at"
BUGS_KEY = "minify:bugs"
EVENTS_MAXLEN = 10_000
CANCEL_TTL_S = 7 * 24 * 3600
# The statuses of a job an identical submission gets instead of a new one.
REUSABLE = (JobState.queued.value, JobState.running.value, JobState.succeeded.value)
# The job the content key names and its status, when that job is reusable (read only: one round trip).
_EXISTING = """
local current = redis.call('GET', KEYS[1])
if not current then return false end
local status = redis.call('HGET', ARGV[1] .. current, 'status')
if status == 'queued' or status == 'running' or status == 'succeeded' then return {current, status} end
return false
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def record_key(job_id: str) -> str:
    return f"minify:job:{job_id}"


def events_key(job_id: str) -> str:
    return f"minify:job:{job_id}:events"


def cancel_key(job_id: str) -> str:
    return f"minify:job:{job_id}:cancel"


def content_key(digest: str) -> str:
    return f"minify:content:{digest}"


def bug_record_key(bug_id: str) -> str:
    return f"minify:bug:{bug_id}"


def bug_jobs_key(bug_id: str) -> str:
    return f"minify:bug:{bug_id}:jobs"


def ticket_keys(job_id: str) -> dict[str, str]:
    """The keys the job entry writes; `bug` and `bug_jobs` are templates of `{bug}` (the bug id)."""
    return {
        "record": record_key(job_id),
        "events": events_key(job_id),
        "cancel": cancel_key(job_id),
        "counters": COUNTERS_KEY,
        "bugs": BUGS_KEY,
        "bug": bug_record_key("{bug}"),
        "bug_jobs": bug_jobs_key("{bug}"),
    }


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


def event_fields(event: ProgressEvent) -> dict[str, str]:
    """A stream entry: the SSE event type and the ProgressEvent as JSON."""
    return {"event": event.type, "data": event.model_dump_json(exclude_none=True)}


def to_job_status(fields: dict[str, str]) -> JobStatus:
    data: dict[str, Any] = {
        "id": fields["id"],
        "status": fields["status"],
        "spec": JobSpec.model_validate_json(fields["spec"]),
        "created_at": fields["created_at"],
        "attempts": int(fields.get("attempts", 0)),
    }
    for name in ("started_at", "finished_at", "reason", "worker", "program_name", "bug", "culprit_state"):
        if fields.get(name):
            data[name] = fields[name]
    if fields.get("progress"):
        data["progress"] = json.loads(fields["progress"])
    if fields.get("result"):
        data["result"] = Report.model_validate_json(fields["result"])
    return JobStatus.model_validate(data)


def create_unless_identical(redis: SyncRedis, job_id: str, fields: dict[str, str], force: bool,
                            enqueue: Callable[[SyncPipeline], object]) -> tuple[str, JobState] | None:
    """Create the job (`add_record`, and `enqueue(pipe)` its RQ job) in one transaction, unless the
    content key of its submission (the `content` field) names a job that is queued, running or
    succeeded: then that job and its status, and nothing is written. The key is watched, so of two
    identical submissions racing here one creates the job and the other gets it. `force` creates
    regardless (and the new job takes the key)."""
    key = content_key(fields["content"])
    with redis.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(key)
                current = pipe.get(key)
                if current is not None and not force:
                    owner = current.decode()
                    status = pipe.hget(record_key(owner), "status")
                    if status is not None and status.decode() in REUSABLE:
                        pipe.unwatch()
                        return owner, JobState(status.decode())
                pipe.multi()
                enqueue(pipe)
                add_record(pipe, job_id, fields)
                pipe.execute()
                return None
            except WatchError:  # the key changed meanwhile: an identical submission made its job
                continue


def add_record(pipe: Any, job_id: str, fields: dict[str, str]) -> None:
    """Queue on a transaction `pipe` (sync or async) what creates a job: its record, its place in the
    index and its first event; the content key (the `content` field) names it from then on."""
    created = datetime.fromisoformat(fields["created_at"]).timestamp()
    queued = ProgressEvent(type="status", status=JobState.queued, message="queued")
    pipe.hset(record_key(job_id), mapping=fields)
    if fields.get("content"):
        pipe.set(content_key(fields["content"]), job_id)
    pipe.zadd(INDEX_KEY, {job_id: created})
    pipe.xadd(events_key(job_id), event_fields(queued), maxlen=EVENTS_MAXLEN, approximate=True)


class JobRecords:
    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._existing = redis.register_script(_EXISTING)  # EVALSHA: the script is sent once
        self._release = redis.register_script(_RELEASE)

    async def existing(self, digest: str) -> tuple[str, JobState] | None:
        """The job an identical submission made (the content key `digest` names it) and its status,
        while it is queued, running or succeeded."""
        found = await self._existing(keys=[content_key(digest)], args=[record_key("")])
        return (found[0], JobState(found[1])) if found else None

    async def release(self, digest: str, job_id: str) -> None:
        """Delete the content key when it still names `job_id` (retention deleted the job)."""
        await self._release(keys=[content_key(digest)], args=[job_id])

    async def get(self, job_id: str) -> dict[str, str] | None:
        fields = await self.redis.hgetall(record_key(job_id))
        return fields or None

    async def page(self, offset: int, limit: int,
                   status: JobState | None = None) -> tuple[list[dict[str, str]], int]:
        """Records newest first; with `status`, only those (and `total` counts only those)."""
        if status is None:
            total = await self.redis.zcard(INDEX_KEY)
            ids = await self.redis.zrevrange(INDEX_KEY, offset, offset + limit - 1)
        else:
            every = await self.redis.zrevrange(INDEX_KEY, 0, -1)
            async with self.redis.pipeline(transaction=False) as pipe:
                for job_id in every:
                    pipe.hget(record_key(job_id), "status")
                statuses = await pipe.execute()
            matching = [job_id for job_id, value in zip(every, statuses, strict=True) if value == status.value]
            total = len(matching)
            ids = matching[offset:offset + limit]
        async with self.redis.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hgetall(record_key(job_id))
            rows = await pipe.execute()
        return [row for row in rows if row], total

    async def statuses(self) -> list[str]:
        ids = await self.redis.zrange(INDEX_KEY, 0, -1)
        async with self.redis.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hget(record_key(job_id), "status")
            return [status for status in await pipe.execute() if status]

    async def request_cancel(self, job_id: str) -> bool:
        """Flag the job for cancellation; when still queued, mark it cancelled now. True if it was queued."""
        await self.redis.set(cancel_key(job_id), "1", ex=CANCEL_TTL_S)
        key = record_key(job_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    if await pipe.hget(key, "status") != JobState.queued.value:
                        await pipe.unwatch()
                        return False
                    pipe.multi()
                    pipe.hset(key, mapping={"status": JobState.cancelled.value, "finished_at": now_iso(),
                                            "reason": "cancelled before it started"})
                    event = ProgressEvent(type="status", status=JobState.cancelled,
                                          message="cancelled before it started")
                    pipe.xadd(events_key(job_id), event_fields(event), maxlen=EVENTS_MAXLEN, approximate=True)
                    await pipe.execute()
                    return True
                except WatchError:  # the worker moved it meanwhile: look again
                    continue

    async def counters(self) -> dict[str, int]:
        return {name: int(value) for name, value in (await self.redis.hgetall(COUNTERS_KEY)).items()}

    async def queue_served_at(self, queue_name: str) -> float | None:
        """When a live worker last served the queue (epoch seconds), if ever."""
        value = await self.redis.hget(QUEUES_SERVED_KEY, queue_name)
        return float(value) if value else None
