"""No `minify-job-*` folder outlives its run: SIGTERM cleans up, a starting worker removes dead runs' folders."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.backends import ALLOWED, PREFIX
from tests.support.private_redis import private_redis
from tests.support.service import MARKER, marked_pids

HANG_ON_RELU = ["--backend", f"{PREFIX}:hang_with_grandchild_on_relu", "--failure", "timeout",
                "--candidate-timeout", "120"]
MAKE_JOB_DIR = "from minify_worker.engine.workdirs import make_job_dir; print(make_job_dir(), flush=True)"


def job_dirs(temp_dir: Path) -> list[Path]:
    return sorted(temp_dir.glob("minify-job-*"))


def wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {timeout_s:.0f} s")
        time.sleep(0.1)


@pytest.fixture
def temp_dir(tmp_path: Path) -> Path:
    """TMPDIR of the processes under test: their job folders are seen apart from anyone else's."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    return folder


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    with private_redis(tmp_path / "redis.db") as server:
        yield f"unix://{server.socket_file}"


def test_sigterm_of_the_offline_command_removes_its_job_folder(temp_dir: Path, tmp_path: Path,
                                                               programs: dict[str, Path]) -> None:
    marker = uuid.uuid4().hex
    env = {**os.environ, "TMPDIR": str(temp_dir), **ALLOWED,
           MARKER: marker}
    command = subprocess.Popen([sys.executable, "-m", "minify_worker.cli", "minify", str(programs["relu_cos"]),
                                *HANG_ON_RELU, "--quiet", "--out", str(tmp_path / "out")],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: job_dirs(temp_dir), 120, "a job folder")
        time.sleep(2)  # into the run: the sandbox and its children are up
        command.send_signal(signal.SIGTERM)
        _, stderr = command.communicate(timeout=60)
    finally:
        if command.poll() is None:
            command.kill()
    assert command.returncode == 128 + signal.SIGTERM, stderr
    assert "terminated" in stderr
    assert job_dirs(temp_dir) == []
    wait_until(lambda: not marked_pids(marker), 10, "every child gone")


def test_a_starting_worker_removes_job_folders_of_dead_processes_only(temp_dir: Path, redis_url: str) -> None:
    env = {**os.environ, "TMPDIR": str(temp_dir)}
    dead = Path(subprocess.run([sys.executable, "-c", MAKE_JOB_DIR], env=env, capture_output=True, text=True,
                               check=True).stdout.strip())
    holder = subprocess.Popen([sys.executable, "-c", f"{MAKE_JOB_DIR}; import time; time.sleep(120)"], env=env,
                              stdout=subprocess.PIPE, text=True)
    unmarked = temp_dir / "minify-job-unmarked"
    unmarked.mkdir()
    try:
        live = Path(holder.stdout.readline().strip())
        (dead / "candidate.pt").write_bytes(b"left by a killed run")
        worker = subprocess.run([sys.executable, "-m", "minify_worker.cli", "--redis-url", redis_url, "--queues",
                                 "cpu", "--burst", "--no-preload"], env=env, capture_output=True, text=True,
                                timeout=60)
        assert worker.returncode == 0, worker.stderr
        assert job_dirs(temp_dir) == sorted([live, unmarked])
    finally:
        holder.kill()
        holder.wait()
