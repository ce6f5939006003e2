"""`minify-client submit --wait` rides out a restart of the real `minify-server`.

The API server is stopped and started again on the same port while the client waits; Redis (the
embedded one of a second, worker-less server) and the job's data live on, as they do when an
operator restarts the API in front of a shared Redis. The worker starts during the outage, and
the API comes back only once the job has ended: the client shows what it missed (the job's
progress and its final status), replayed from the job's event stream.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from examples.programs import save
from tests.support.backends import ALLOWED, PREFIX
from tests.support.service import MARKER, Service, free_port, start_service, wait_healthy

FAIL_ON_RELU = f"{PREFIX}:fail_on_relu"
OUTAGE_S = 3.0


def start_api(backing: Service, port: int, data_dir: Path) -> subprocess.Popen:
    """A `minify-server` API in front of `backing`'s Redis, healthy on `port`."""
    env = {**os.environ, MARKER: backing.marker, **ALLOWED}
    env.pop("MINIFY_TOKENS", None)
    with open(data_dir / "api.log", "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-c", "import sys; from minify_server.cli import main; sys.exit(main())",
             "--redis-url", backing.redis_url, "--data-dir", str(data_dir), "--port", str(port)],
            env=env, stdout=log, stderr=subprocess.STDOUT)
    wait_healthy(f"http://127.0.0.1:{port}", 0, process, timeout_s=60)
    return process


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_finished(backing: Service, job_id: str, timeout_s: float = 240) -> str:
    """The job's state once it has ended, read from the backing server (same Redis)."""
    deadline = time.monotonic() + timeout_s
    with backing.client() as http:
        while time.monotonic() < deadline:
            state = http.get(f"/v1/jobs/{job_id}").json()["status"]
            if state not in ("queued", "running"):
                return state
            time.sleep(0.5)
    raise AssertionError(f"job {job_id} did not end in {timeout_s:.0f} s")


def test_submit_wait_exits_0_with_the_artifacts_after_the_server_was_away_for_seconds(tmp_path: Path):
    program = save("relu_cos", tmp_path)
    out = tmp_path / "repro"
    api_dir = tmp_path / "api"
    api_dir.mkdir()
    port = free_port()
    with start_service(tmp_path / "backing", workers=0) as backing:
        api = start_api(backing, port, api_dir)
        worker: subprocess.Popen | None = None
        client = subprocess.Popen(
            [sys.executable, "-m", "minify_client.cli", "submit", str(program), "--backend", FAIL_ON_RELU,
             "--wait", "--out", str(out), "--server", f"http://127.0.0.1:{port}", "--retry-for", "120"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "MINIFY_TOKEN": ""})
        try:
            assert client.stdout is not None
            submitted = client.stdout.readline()
            assert submitted.startswith("submitted job ")
            job_id = submitted.split()[2].rstrip(":")
            stop(api)
            worker = subprocess.Popen(
                [sys.executable, "-m", "minify_worker.cli", "--redis-url", backing.redis_url, "--queues", "cpu",
                 "--no-warm-up"],  # its job's backend is a test one: no inductor to warm up
                env={**os.environ, MARKER: backing.marker, **ALLOWED},
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(OUTAGE_S)
            assert wait_finished(backing, job_id) == "succeeded"
            assert client.poll() is None, "the client gave up during the outage"
            api = start_api(backing, port, api_dir)
            stdout, stderr = client.communicate(timeout=300)
        finally:
            client.kill()
            stop(api)
            if worker is not None:
                stop(worker)

    assert client.returncode == 0, stdout + stderr
    assert "minify-client: server unreachable (" in stderr
    assert "minify-client: server reachable again after " in stderr
    assert "status: running" in stdout  # replayed: the job started and ended while the server was away
    assert "status: succeeded" in stdout
    assert {"minimized.pt2", "repro.py", "inputs.pt", "report.json"} <= {p.name for p in out.iterdir()}
