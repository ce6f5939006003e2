"""`minify-client` end to end: the real CLI as a subprocess against the real `minify-server`
(embedded Redis, a real worker, the real engine) on example programs.

The jobs use the cheap test backends (tests/support/backends.py); the README's service example
(tests/test_readme.py) takes a real inductor compile error through the same client and service.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from examples.programs import save
from minify_client import Client, JobState, Unauthorized
from tests.support.backends import PREFIX
from tests.support.service import Service, start_service

TOKEN = "e2e-token"
FAIL_ON_RELU = f"{PREFIX}:fail_on_relu"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with start_service(tmp_path_factory.mktemp("service"), workers=1, tokens=[TOKEN]) as running:
        yield running


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("programs")
    for name in ("relu_cos", "accuracy_vs_strict"):
        save(name, directory)
    return directory


def run_cli(*args: str | Path, server: str | None = None, token: str | None = TOKEN, cwd: Path | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MINIFY_SERVER", "MINIFY_TOKEN")}
    if server is not None:
        env["MINIFY_SERVER"] = server
    if token is not None:
        env["MINIFY_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "minify_client.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def test_submit_wait_minimizes_the_seed_relu_program(service: Service, programs: Path, tmp_path: Path):
    out = tmp_path / "repro"
    result = run_cli("submit", programs / "relu_cos.pt2", "--backend", FAIL_ON_RELU, "--wait", "--out", out,
                     server=service.url)

    assert result.returncode == 0, result.stdout + result.stderr
    assert {"minimized.pt2", "repro.py", "report.json"} <= {p.name for p in out.iterdir()}
    assert not [p for p in out.iterdir() if p.name.endswith(".part")]
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "succeeded"
    assert report["nodes_final"] == 1
    assert "minimized graph:" in result.stdout
    assert "relu" in result.stdout.split("minimized graph:")[1]
    assert "cos" not in result.stdout.split("minimized graph:")[1]
    assert f"reproduce with: python {out / 'repro.py'}" in result.stdout
    minimized = torch.export.load(out / "minimized.pt2")
    ops = [n.target for n in minimized.graph.nodes if n.op == "call_function"]
    assert ops == [torch.ops.aten.relu.default]


def test_a_program_that_passes_exits_3(service: Service, programs: Path, tmp_path: Path):
    # accuracy_vs_strict has relu too; fail_on_cos fails only on cos, which it lacks.
    result = run_cli("submit", programs / "accuracy_vs_strict.pt2",
                     "--backend", f"{PREFIX}:fail_on_cos", "--wait", "--json",
                     "--out", tmp_path / "out", server=service.url)
    assert result.returncode == 3, result.stdout + result.stderr
    outcome = json.loads(result.stdout)
    assert outcome["status"] == "not_reproducible"
    assert outcome["exit_code"] == 3


def test_the_python_api_submits_follows_and_downloads(service: Service, programs: Path, tmp_path: Path):
    with Client(service.url, TOKEN) as client:
        created = client.submit(programs / "relu_cos.pt2", {"backend": FAIL_ON_RELU})
        phases = []
        final = client.wait(created.id, on_event=lambda e: phases.append(e.phase or e.type))
        paths = client.download(created.id, tmp_path)
        bundle = client.download_artifact(created.id, "bundle.tar.gz", tmp_path)
        listed = client.list(JobState.succeeded)

    assert final.status == JobState.succeeded
    assert "status" in phases and len(phases) > 2
    assert paths["repro.py"].read_text().strip()
    assert bundle.stat().st_size > 0
    assert created.id in [job.id for job in listed.jobs]


def test_status_list_and_download_subcommands(service: Service, programs: Path, tmp_path: Path):
    created = run_cli("submit", programs / "relu_cos.pt2", "--backend", FAIL_ON_RELU, server=service.url)
    job_id = created.stdout.splitlines()[0]
    assert created.stdout.splitlines()[1] == f"dashboard: {service.url}/?job={job_id}"

    watched = run_cli("watch", job_id, server=service.url)
    assert watched.returncode == 0, watched.stdout + watched.stderr
    status = run_cli("status", job_id, "--json", server=service.url)
    assert json.loads(status.stdout)["status"] == "succeeded"
    listing = run_cli("list", "--status", "succeeded", server=service.url)
    assert job_id in listing.stdout
    download = run_cli("download", job_id, "--name", "repro.py", "--out", tmp_path, server=service.url)
    assert download.returncode == 0, download.stderr
    assert download.stdout.strip() == str(tmp_path / "repro.py")


def test_cancel_ends_a_running_job_and_watch_exits_1(service: Service, programs: Path, tmp_path: Path):
    created = run_cli("submit", programs / "relu_cos.pt2", "--backend",
                      f"{PREFIX}:hang_on_relu", "--candidate-timeout", "300",
                      server=service.url)
    job_id = created.stdout.splitlines()[0]
    watcher = subprocess.Popen([sys.executable, "-m", "minify_client.cli", "watch", job_id],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "MINIFY_SERVER": service.url, "MINIFY_TOKEN": TOKEN})
    try:
        with Client(service.url, TOKEN) as client:
            deadline = time.monotonic() + 120
            while client.status(job_id).status != JobState.running and time.monotonic() < deadline:
                time.sleep(0.2)
        cancelled = run_cli("cancel", job_id, server=service.url)
        assert cancelled.returncode == 0, cancelled.stderr
        stdout, stderr = watcher.communicate(timeout=120)
    finally:
        watcher.kill()
    assert watcher.returncode == 1, stdout + stderr
    assert "cancelled" in stdout


def test_a_missing_token_is_refused_with_one_line(service: Service, programs: Path):
    result = run_cli("submit", programs / "relu_cos.pt2", server=service.url, token=None)
    assert result.returncode == 1
    assert result.stderr.startswith("minify-client: error: the server answered 401")
    assert result.stderr.count("\n") == 1
    with Client(service.url, "wrong") as client, pytest.raises(Unauthorized):
        client.list()


def test_a_stopped_server_gives_a_clear_error_and_exit_1(programs: Path, tmp_path: Path):
    with start_service(tmp_path / "service", workers=0) as stopped:
        url = stopped.url
    result = run_cli("submit", programs / "relu_cos.pt2", "--wait", "--retry-for", "1", server=url)
    assert result.returncode == 1
    said, error = result.stderr.splitlines()
    assert said.startswith("minify-client: server unreachable (")
    assert error.startswith(f"minify-client: error: cannot reach minify server at {url}: ")
    assert error.endswith("(gave up after retrying for 1 s)")
