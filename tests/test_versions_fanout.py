"""The version phase through the service: after the result, repro.py runs under every torch version
the fleet offers, fanned out through RQ to a queue per version, and report.json, repro.py's header,
the job record, the event stream, /v1/workers and /metrics say which versions have the bug.

Real parts: minify-server with its embedded Redis and an RQ worker, a second RQ worker process,
the engine, and repro.py run by three real interpreters. Stand-ins, because CI cannot afford a
second multi-GB torch: the two other interpreters are venvs that share the CI venv's torch (a .pth
that adds its site-packages) and report another version (a sitecustomize that sets
torch.__version__: 2.12.0 on the service's worker, 2.14.1 on the second worker); and the bug is a
test backend that fails on torch 2.13.x only (tests/support/torch_versions.py), standing in for a
regression in 2.13 fixed in 2.14.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from redis import Redis
from rq.exceptions import NoSuchJobError
from rq.job import Job

from minify_worker.versions.envs import own_env
from minify_worker.versions.phase import probe_job_id
from tests.support.service import Service, read_events, start_service, wait_for_culprit
from tests.support.torch_versions import MODULE, stand_in_env
from tests.test_service import submit

pytestmark = pytest.mark.xdist_group("test_versions_fanout")

ALLOWED = f"tests.support.backends,{MODULE}"
# The culprit phase of a custom backend ends at once (no stages to bisect); the version phase follows it.
SPEC = {"backend": f"{MODULE}:fail_on_relu_from_2_13_until_2_14", "failure": {"kind": "compile_error"}}
OWN = own_env().torch  # the CI venv's: 2.13.0+cpu


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """The service's worker holds the CI torch and a stand-in 2.12.0; a second worker (serving only the
    cuda queue, so it never takes the minification itself) holds the CI torch and a stand-in 2.14.1."""
    folder = tmp_path_factory.mktemp("versions")
    older, newer = stand_in_env(folder / "torch-2.12.0", "2.12.0"), stand_in_env(folder / "torch-2.14.1", "2.14.1")
    env = {"MINIFY_ALLOWED_BACKENDS": ALLOWED, "MINIFY_TORCH_ENVS": str(older)}
    with start_service(folder / "data", workers=1, env=env) as service, open(folder / "second.log", "wb") as log:
        second = subprocess.Popen(
            [sys.executable, "-c", "import sys; from minify_worker.cli import main; sys.exit(main())",
             "--redis-url", service.redis_url, "--queues", "cuda", "--name", "second", "--no-preload"],
            env={**os.environ, **env, "MINIFY_TORCH_ENVS": str(newer)}, stdout=log, stderr=subprocess.STDOUT)
        try:
            with service.client() as client:
                _wait_for_versions(client, {"2.12.0", OWN, "2.14.1"})
            yield service
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(30)


def _wait_for_versions(client: httpx.Client, versions: set[str], timeout_s: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        body = client.get("/v1/workers").json()
        if set(body["versions"]) >= versions:
            return body
        if time.monotonic() > deadline:
            raise TimeoutError(f"the workers never offered {versions}: {body}")
        time.sleep(0.2)


def test_workers_list_the_torch_versions_they_hold_and_metrics_count_them(fleet: Service) -> None:
    with fleet.client() as client:
        body = client.get("/v1/workers").json()
        metrics = client.get("/metrics").text

    held = {worker["name"]: sorted(install["torch"] for install in worker["torch"]) for worker in body["workers"]}
    assert held["second"] == sorted([OWN, "2.14.1"])
    assert sorted(held.values()) == sorted([sorted([OWN, "2.12.0"]), sorted([OWN, "2.14.1"])])
    assert body["versions"] == dict(sorted({OWN: 2, "2.12.0": 1, "2.14.1": 1}.items()))
    second = next(worker for worker in body["workers"] if worker["name"] == "second")
    assert "minify-torch-2.14.1" in second["queues"]
    assert f'minify_worker_torch_versions{{torch="{OWN}"}} 2.0' in metrics
    assert 'minify_worker_torch_versions{torch="2.14.1"} 1.0' in metrics


def test_a_job_says_which_torch_versions_fail_the_regression_range_and_the_fix(
        fleet: Service, programs: dict[str, Path]) -> None:
    with fleet.client() as client:
        job_id = submit(client, programs["relu_cos"], SPEC)
        done = wait_for_culprit(client, job_id, timeout_s=240)
        report = client.get(f"/v1/jobs/{job_id}/artifacts/report.json").json()
        repro = client.get(f"/v1/jobs/{job_id}/artifacts/repro.py").text
        events = read_events(client, job_id, timeout_s=30)
    redis = Redis.from_url(fleet.redis_url)

    assert done["status"] == "succeeded", done
    result = done["result"]
    assert result["versions_state"] == "done" and report["versions_state"] == "done"
    outcomes = {run["torch"]: run["outcome"] for run in report["versions"]}
    assert outcomes == {"2.12.0": "passes", OWN: "same", "2.14.1": "passes"}
    assert [run["torch"] for run in report["versions"]] == ["2.12.0", OWN, "2.14.1"]
    assert {run["torch"]: run["git_version"] for run in report["versions"]}["2.14.1"] == "standin2141"
    assert report["regression_range"] == {"last_good": "2.12.0", "first_bad": OWN}
    assert report["fixed_in"] == "2.14.1"
    summary = f"fails on {OWN}; passes on 2.12.0, 2.14.1: regression in (2.12.0, {OWN}]; fixed in 2.14.1"
    assert report["versions_summary"] == summary and result["versions_summary"] == summary
    assert f"# Torch versions:   {summary}" in repro
    # 2.14.1 went through its queue to the second worker; 2.12.0, held only by the busy worker that
    # ran the job, was taken off its queue and run by that job itself.
    assert Job.fetch(probe_job_id(job_id, "2.14.1"), connection=redis).worker_name == "second"
    with pytest.raises(NoSuchJobError):
        Job.fetch(probe_job_id(job_id, "2.12.0"), connection=redis)
    kinds = [event.event for event in events]
    assert "versions" in kinds and kinds[-1] == "culprit"
    assert next(event.data["message"] for event in events if event.event == "versions") == summary


def test_no_versions_skips_the_phase(fleet: Service, programs: dict[str, Path]) -> None:
    with fleet.client() as client:
        job_id = submit(client, programs["relu_cos"], {**SPEC, "versions": False})
        done = wait_for_culprit(client, job_id, timeout_s=120)
        report = client.get(f"/v1/jobs/{job_id}/artifacts/report.json").json()
    redis = Redis.from_url(fleet.redis_url)

    assert done["status"] == "succeeded"
    assert report["versions"] == [] and report["versions_state"] is None and report["versions_summary"] is None
    with pytest.raises(NoSuchJobError):
        Job.fetch(probe_job_id(job_id, "2.14.1"), connection=redis)
