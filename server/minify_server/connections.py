"""The server's Redis clients, each call bounded by a short timeout, and the log of Redis outages.

A Redis that is down (restarting: refused connections) or hung (SIGSTOP, a full disk, a network
partition: reads that never return) must cost a request seconds, not minutes: every client has a
connect and a read timeout, and one quick retry for a restart's half-second gap. Requests that
meet an outage answer 503 with Retry-After (errors.py); the log gets one line when an outage
starts and one when Redis answers again, not a traceback per request.
"""

from __future__ import annotations

import logging
import time

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 3.0
CONNECT_TIMEOUT_S = 2.0
RETRIES = 1
RETRY_AFTER_S = 2
# What "Redis is unavailable" looks like from redis-py (BusyLoadingError, a Redis still loading its
# append-only file after a restart, is a ConnectionError).
UNAVAILABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


def _backoff() -> ExponentialBackoff:
    return ExponentialBackoff(cap=0.5, base=0.1)


def async_client(url: str, read_timeout_s: float = READ_TIMEOUT_S) -> redis.asyncio.Redis:
    """For the routes; `read_timeout_s` must exceed any blocking command's own wait (XREAD BLOCK)."""
    return redis.asyncio.Redis.from_url(url, decode_responses=True, socket_timeout=read_timeout_s,
                                        socket_connect_timeout=CONNECT_TIMEOUT_S,
                                        retry=AsyncRetry(_backoff(), RETRIES))


def sync_client(url: str) -> redis.Redis:
    """For RQ (enqueue, dequeue of a cancelled job), which needs a synchronous connection."""
    return redis.Redis.from_url(url, socket_timeout=READ_TIMEOUT_S, socket_connect_timeout=CONNECT_TIMEOUT_S,
                                retry=Retry(_backoff(), RETRIES))


class OutageLog:
    """One warning when Redis stops answering, one when it answers again."""

    def __init__(self) -> None:
        self.since: float | None = None

    def failed(self, error: Exception) -> None:
        if self.since is None:
            self.since = time.monotonic()
            log.warning("Redis unavailable (%s: %s); answering 503 until it is back",
                        type(error).__name__, error)

    def recovered(self) -> None:
        if self.since is not None:
            log.warning("Redis available again after %.1f s", time.monotonic() - self.since)
            self.since = None
