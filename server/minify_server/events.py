"""A job's Redis stream as Server-Sent Events: history first, then live, until the job ends.

A succeeded job whose culprit phase still runs (its final status event says culprit_state
`running`) has not ended for the stream: it goes on to the `culprit` event that ends the phase."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from redis.asyncio import Redis

from minify_contract.ledger import events_key, record_key
from minify_contract.models import CulpritState, JobState
from minify_server.connections import UNAVAILABLE, OutageLog

BLOCK_MS = 5_000
BATCH = 500


def _is_final(fields: dict[str, str]) -> bool:
    data = json.loads(fields.get("data", "{}"))
    if fields.get("event") == "culprit":
        return data.get("culprit_state") != CulpritState.running.value
    if fields.get("event") != "status":
        return False
    status = data.get("status")
    return status is not None and JobState(status).finished and data.get("culprit_state") != CulpritState.running.value


async def job_events(redis: Redis, job_id: str, last_event_id: str | None,
                     outages: OutageLog, stopping: asyncio.Event | None = None) -> AsyncIterator[str]:
    """`id:`/`event:`/`data:` frames; the stream entry id is the SSE id, so Last-Event-ID resumes.

    When Redis becomes unavailable, or the server stops (`stopping` set), the stream ends early;
    EventSource and the client reconnect with Last-Event-ID (after the `retry:` delay) and lose
    nothing. A stop ends it at once, not when the server's graceful wait cancels it.
    """
    stream = events_key(job_id)
    cursor = last_event_id or "0-0"
    yield "retry: 2000\n\n"
    try:
        while True:
            batches = await _read_unless_stopping(redis, {stream: cursor}, stopping)
            if batches is None:
                return
            if not batches:
                status, culprit_state = await redis.hmget(record_key(job_id), ["status", "culprit_state"])
                if status is None or (JobState(status).finished and culprit_state != CulpritState.running.value):
                    return  # ended without a final event we have not sent (e.g. expired history)
                yield ": keep-alive\n\n"
                continue
            for entry_id, fields in batches[0][1]:
                cursor = entry_id
                yield f"id: {entry_id}\nevent: {fields.get('event', 'log')}\ndata: {fields.get('data', '{}')}\n\n"
                if _is_final(fields):
                    return
    except UNAVAILABLE as error:
        outages.failed(error)


async def _read_unless_stopping(redis: Redis, streams: dict[str, str], stopping: asyncio.Event | None) -> Any:
    """One blocking XREAD; None when `stopping` is set first (the read is abandoned)."""
    read = asyncio.ensure_future(redis.xread(streams, count=BATCH, block=BLOCK_MS))
    if stopping is None:
        return await read
    stop = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait({read, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if read.done():
        return read.result()
    read.cancel()
    return None
