"""Job records in Redis, the server's side: create a job, read records, cancel (async, except the
creation, which shares one transaction with RQ's enqueue). The layout, the record's model and the
key names are the ledger's (minify_contract/ledger.py), which the worker's job entry writes through too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from redis import Redis as SyncRedis
from redis.asyncio import Redis
from redis.client import Pipeline as SyncPipeline
from redis.exceptions import WatchError

from minify_contract.ledger import (
    CANCEL_TTL_S,
    COUNTERS_KEY,
    INDEX_KEY,
    QUEUES_SERVED_KEY,
    JobRecord,
    add_event,
    cancel_key,
    content_key,
    events_key,
    now_iso,
    record_fields,
    record_key,
)
from minify_contract.models import JobState, ProgressEvent

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


def create_unless_identical(redis: SyncRedis, record: JobRecord, force: bool,
                            enqueue: Callable[[SyncPipeline], object]) -> tuple[str, JobState] | None:
    """Create the job (`add_record`, and `enqueue(pipe)` its RQ job) in one transaction, unless the
    content key of its submission (the record's `content`) names a job that is queued, running or
    succeeded: then that job and its status, and nothing is written. The key is watched, so of two
    identical submissions racing here one creates the job and the other gets it. `force` creates
    regardless (and the new job takes the key)."""
    assert record.content is not None, "a new job's record names its submission's content"
    key = content_key(record.content)
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
                add_record(pipe, record)
                pipe.execute()
                return None
            except WatchError:  # the key changed meanwhile: an identical submission made its job
                continue


def add_record(pipe: Any, record: JobRecord) -> None:
    """Queue on a transaction `pipe` (sync or async) what creates a job: its record, its place in the
    index and its first event; the content key (the record's `content`) names it from then on."""
    queued = ProgressEvent(type="status", status=JobState.queued, message="queued")
    pipe.hset(record_key(record.id), mapping=record.to_hash())
    if record.content:
        pipe.set(content_key(record.content), record.id)
    pipe.zadd(INDEX_KEY, {record.id: record.created_at.timestamp()})
    add_event(pipe, events_key(record.id), queued)


# The record's fields a search reads: status first, then what it matches in.
_SEARCHED_FIELDS = ["status", "program_name", "reason", "spec", "result"]


def _searched_text(job_id: str, fields: list[str | None]) -> str:
    """What a search matches in, lowercased: the id, program name, spec (backend, device, config),
    reason and the result's signature."""
    _, program_name, reason, spec, result = fields
    signature = ""
    if result:
        try:
            signature = json.loads(result).get("signature") or ""
        except ValueError:
            signature = ""
    return " ".join([job_id, program_name or "", reason or "", spec or "", signature]).lower()


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

    async def get(self, job_id: str) -> JobRecord | None:
        fields = await self.redis.hgetall(record_key(job_id))
        return JobRecord.from_hash(fields) if fields else None

    async def page(self, offset: int, limit: int, status: JobState | None = None,
                   search: str | None = None) -> tuple[list[JobRecord], int]:
        """Records newest first; with `status`, only those, and with `search`, only those whose id,
        program name, spec, reason or signature hold it (case-insensitively); `total` counts those."""
        if status is None and not search:
            total = await self.redis.zcard(INDEX_KEY)
            ids = await self.redis.zrevrange(INDEX_KEY, offset, offset + limit - 1)
        else:
            every = await self.redis.zrevrange(INDEX_KEY, 0, -1)
            async with self.redis.pipeline(transaction=False) as pipe:
                for job_id in every:
                    pipe.hmget(record_key(job_id), _SEARCHED_FIELDS)
                found = await pipe.execute()
            needle = (search or "").lower()
            matching = [job_id for job_id, fields in zip(every, found, strict=True)
                        if (status is None or fields[0] == status.value)
                        and (not needle or needle in _searched_text(job_id, fields))]
            total = len(matching)
            ids = matching[offset:offset + limit]
        async with self.redis.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hgetall(record_key(job_id))
            rows = await pipe.execute()
        return [JobRecord.from_hash(row) for row in rows if row], total

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
                    pipe.hset(key, mapping=record_fields(status=JobState.cancelled, finished_at=now_iso(),
                                                         reason="cancelled before it started"))
                    event = ProgressEvent(type="status", status=JobState.cancelled,
                                          message="cancelled before it started")
                    add_event(pipe, events_key(job_id), event)
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
