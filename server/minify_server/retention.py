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

from redis.asyncio import Redis

from minify_contract.ledger import INDEX_KEY, JobFootprint, cancel_key, events_key, record_key, write_mark_key
from minify_contract.models import JobState
from minify_server.bugs import BugIndex
from minify_server.connections import UNAVAILABLE
from minify_server.records import JobRecords
from minify_server.store import ArtifactStore

log = logging.getLogger(__name__)

DAY_S = 24 * 3600


@dataclass(frozen=True)
class Swept:
    jobs: int
    bugs: int
    files: int


async def sweep(redis: Redis, store: ArtifactStore, retention_s: float, now: float | None = None) -> Swept:
    """Delete what ended more than `retention_s` before `now` (default: the present)."""
    cutoff = (time.time() if now is None else now) - retention_s
    bugs = BugIndex(redis)
    forgotten = await bugs.forget_seen_before(cutoff)
    job_ids = await redis.zrange(INDEX_KEY, 0, -1)
    async with redis.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hmget(record_key(job_id), JobFootprint.fields())
        jobs = dict(zip(job_ids, map(JobFootprint.from_values, await pipe.execute()), strict=True))
    await bugs.file_unfiled([(job_id, job.finished_at) for job_id, job in jobs.items()
                             if job.status is JobState.succeeded and job.finished_at and not job.bug
                             and not job.ended_before(cutoff)])
    keep = await bugs.representatives()
    expired: list[tuple[str, str | None]] = []
    referenced: set[str] = set()
    for job_id, job in jobs.items():
        if job_id not in keep and job.ended_before(cutoff):
            expired.append((job_id, job.content))
        else:
            referenced.update(job.uploads)
    records = JobRecords(redis)
    for job_id, content in expired:
        async with redis.pipeline(transaction=True) as pipe:
            pipe.delete(record_key(job_id), events_key(job_id), cancel_key(job_id), write_mark_key(record_key(job_id)))
            pipe.zrem(INDEX_KEY, job_id)
            await pipe.execute()
        if content:
            await records.release(content, job_id)
        await asyncio.to_thread(store.remove_job, job_id)
    # asyncio's thread, not anyio's: a cancel (the server stopping) must end the sweep, not be swallowed
    files = await asyncio.to_thread(store.remove_stale_files, referenced, cutoff)
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
