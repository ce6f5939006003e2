"""Retention: what ended more than MINIFY_RETENTION_DAYS ago is deleted, in Redis and on disk.

The same periodic sweep first files the succeeded jobs no worker filed under a bug (a job queued
before the server knew of bugs: its ticket names no bug keys), `BugIndex.file_unfiled`.

A periodic sweep (every `retention_sweep_interval_s`, and once at start) deletes the job record,
event stream, cancel flag and content key of every job that ended before the cutoff, and its
results folder; then the uploads no remaining job refers to, last uploaded before the cutoff. A bug
last seen before the cutoff is unlisted first; a listed bug's representative job is kept, record
and artifacts, however old (its repro is the bug's). Queued and running jobs are never touched.
Several servers may sweep the same Redis: every step is idempotent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import datetime

from redis.asyncio import Redis
from starlette.concurrency import run_in_threadpool

from minify_client.models import JobState
from minify_server.bugs import BugIndex
from minify_server.connections import UNAVAILABLE
from minify_server.records import INDEX_KEY, JobRecords, cancel_key, events_key, record_key
from minify_server.store import ArtifactStore

log = logging.getLogger(__name__)

DAY_S = 24 * 3600
_FIELDS = ("status", "finished_at", "created_at", "bug", "content", "program_sha256", "inputs_sha256")


@dataclass(frozen=True)
class Swept:
    jobs: int
    bugs: int
    files: int


def _ended_before(fields: list[str | None], cutoff: float) -> bool:
    status, finished_at, created_at = fields[0], fields[1], fields[2]
    if status is None or not JobState(status).finished:
        return False
    when = finished_at or created_at
    return when is not None and datetime.fromisoformat(when).timestamp() < cutoff


async def sweep(redis: Redis, store: ArtifactStore, retention_s: float, now: float | None = None) -> Swept:
    """Delete what ended more than `retention_s` before `now` (default: the present)."""
    cutoff = (time.time() if now is None else now) - retention_s
    bugs = BugIndex(redis)
    forgotten = await bugs.forget_seen_before(cutoff)
    job_ids = await redis.zrange(INDEX_KEY, 0, -1)
    async with redis.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hmget(record_key(job_id), list(_FIELDS))
        rows = await pipe.execute()
    await bugs.file_unfiled([(job_id, fields[1]) for job_id, fields in zip(job_ids, rows, strict=True)
                             if fields[0] == JobState.succeeded.value and fields[1] and not fields[3]
                             and not _ended_before(fields, cutoff)])
    keep = await bugs.representatives()
    expired: list[tuple[str, str | None]] = []
    referenced: set[str] = set()
    for job_id, fields in zip(job_ids, rows, strict=True):
        if job_id not in keep and _ended_before(fields, cutoff):
            expired.append((job_id, fields[4]))
        else:
            referenced.update(sha for sha in fields[5:] if sha)
    records = JobRecords(redis)
    for job_id, content in expired:
        async with redis.pipeline(transaction=True) as pipe:
            pipe.delete(record_key(job_id), events_key(job_id), cancel_key(job_id))
            pipe.zrem(INDEX_KEY, job_id)
            await pipe.execute()
        if content:
            await records.release(content, job_id)
        await run_in_threadpool(store.remove_job, job_id)
    files = await run_in_threadpool(store.remove_stale_files, referenced, cutoff)
    if expired or forgotten or files:
        log.info("retention: deleted %d jobs, %d bugs, %d uploads", len(expired), len(forgotten), files)
    return Swept(jobs=len(expired), bugs=len(forgotten), files=files)


async def sweep_periodically(redis: Redis, store: ArtifactStore, retention_days: float, interval_s: float) -> None:
    """The server's background task: a sweep at start, then every `interval_s`, until cancelled."""
    while True:
        try:
            await sweep(redis, store, retention_days * DAY_S)
        except UNAVAILABLE as error:
            log.warning("retention sweep skipped: Redis unavailable (%s)", error)
        except Exception:
            log.exception("retention sweep failed")
        await asyncio.sleep(interval_s)
