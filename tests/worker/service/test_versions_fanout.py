"""The version phase through the service: after the result, repro.py runs under every torch version
the fleet offers, fanned out through RQ to a queue per version, and report.json, repro.py's header,
the job record, the event stream, /v1/workers and /metrics say which versions have the bug.

Real parts: minify-server with its embedded Redis and an RQ worker, a second RQ worker process,
the engine, and repro.py run by three real interpreters. Stand-ins, because CI cannot afford a
second multi-GB torch: the two other interpreters are venvs that share the CI venv's torch (a .pth
that adds its site-packages) and report another version (a sitecustomize that sets
torch.__version__: 2.12.0 on the service's worker, 2.14.1 on a second worker started part way,
which the server's re-test of open bugs then runs the first job's repro on); and the bug is a
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
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from redis import Redis
from rq.exceptions import NoSuchJobError
from rq.job import Job

from minify_client.cli import main as client_main
from minify_contract.ledger import bug_record_key
from minify_worker.service.versions.envs import own_env
from minify_worker.service.versions.phase import probe_job_id
from tests.client.test_client_cli import run_cli
from tests.support.service import Service, read_events, start_service, wait_for_culprit
from tests.support.torch_versions import MODULE, stand_in_env
from tests.worker.service.test_service import submit
from tests.worker.service.test_versions_envs import stand_in_torch_wheel

pytestmark = pytest.mark.xdist_group("test_versions_fanout")

ALLOWED = f"tests.support.backends,{MODULE}"
# The culprit phase of a custom backend ends at once (no stages to bisect); the version phase follows it.
SPEC = {"backend": f"{MODULE}:fail_on_relu_from_2_13_until_2_14", "failure": {"kind": "compile_error"}}
OWN = own_env().torch  # the CI venv's: 2.13.0+cpu


@dataclass
class Fleet:
    service: Service
    folder: Path
    env: dict[str, str]
    second: subprocess.Popen | None = None

    def start_second_worker(self) -> None:
        """A second worker (serving only the cuda queue, so it never takes a minification) that holds
        the CI torch and a stand-in 2.14.1."""
        newer = stand_in_env(self.folder / "torch-2.14.1", "2.14.1")
        with open(self.folder / "second.log", "wb") as log:
            self.second = subprocess.Popen(
                [sys.executable, "-c", "import sys; from minify_worker.cli import main; sys.exit(main())",
                 "--redis-url", self.service.redis_url, "--queues", "cuda", "--name", "second", "--no-preload"],
                env={**os.environ, **self.env, "MINIFY_TORCH_ENVS": str(newer)}, stdout=log, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """The service's worker holds the CI torch and a stand-in 2.12.0; the server re-tests open bugs
    every second. The tests below start a second worker, with 2.14.1, part way."""
    folder = tmp_path_factory.mktemp("versions")
    older = stand_in_env(folder / "torch-2.12.0", "2.12.0")
    wheels = folder / "wheels"  # an index of stand-in torch wheels (a version and nothing else): it bisects
    wheels.mkdir()
    for version in ("9.0.0", "9.1.0"):
        stand_in_torch_wheel(wheels, version)
    env = {"MINIFY_ALLOWED_BACKENDS": ALLOWED, "MINIFY_TORCH_ENVS": str(older), "MINIFY_RETEST_INTERVAL_S": "1",
           "MINIFY_TORCH_INDEX": str(wheels), "MINIFY_TORCH_CACHE": str(folder / "torch-cache")}
    with start_service(folder / "data", workers=1, env=env) as service:
        running = Fleet(service, folder, env)
        try:
            with service.client() as client:
                _wait_for_versions(client, {"2.12.0", OWN})
            yield running
        finally:
            if running.second is not None:
                running.second.send_signal(signal.SIGTERM)
                running.second.wait(30)


def _wait_for_versions(client: httpx.Client, versions: set[str], timeout_s: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        body = client.get("/v1/workers").json()
        if set(body["versions"]) >= versions:
            return body
        if time.monotonic() > deadline:
            raise TimeoutError(f"the workers never offered {versions}: {body}")
        time.sleep(0.2)


def test_a_job_says_which_torch_versions_fail_and_the_regression_range_and_its_bug_stays_open(
        fleet: Fleet, programs: dict[str, Path]) -> None:
    with fleet.service.client() as client:
        job_id = submit(client, programs["relu_cos"], SPEC)
        done = wait_for_culprit(client, job_id, timeout_s=240)
        report = client.get(f"/v1/jobs/{job_id}/artifacts/report.json").json()
        repro = client.get(f"/v1/jobs/{job_id}/artifacts/repro.py").text
        events = read_events(client, job_id, timeout_s=30)
        bug = client.get(f"/v1/bugs/{done['bug']}").json()
    redis = Redis.from_url(fleet.service.redis_url)

    assert done["status"] == "succeeded", done
    assert done["result"]["versions_state"] == "done" and report["versions_state"] == "done"
    assert [(run["torch"], run["outcome"]) for run in report["versions"]] == [("2.12.0", "passes"), (OWN, "same")]
    assert report["versions"][0]["git_version"] == "standin2120"
    assert report["regression_range"] == {"last_good": "2.12.0", "first_bad": OWN} and report["fixed_in"] is None
    summary = f"fails on {OWN}; passes on 2.12.0: regression in (2.12.0, {OWN}]"
    assert report["versions_summary"] == summary and done["result"]["versions_summary"] == summary
    assert f"# Torch versions:   {summary}" in repro
    # 2.12.0 is held only by the worker busy with this job: the job took its probe off the queue and ran it.
    with pytest.raises(NoSuchJobError):
        Job.fetch(probe_job_id(job_id, "2.12.0"), connection=redis)
    kinds = [event.event for event in events]
    assert "versions" in kinds and kinds[-1] == "culprit"
    assert next(event.data["message"] for event in events if event.event == "versions") == summary
    assert (bug["status"], bug["affected"], bug["fixed_in"]) == ("open", [OWN], None)
    assert bug["versions_tried"] == {"2.12.0": "passes", OWN: "same"}
    # The server re-tests open bugs every second: none of the versions the job's phase ran the repro on.
    assert retests_of(redis, bug["id"]) == []


def retests_of(redis: Redis, bug_id: str) -> list[str]:
    """The re-tests of the bug the server enqueued, queued or run (RQ keeps their jobs an hour)."""
    wanted = f"re-test of bug {bug_record_key(bug_id)} on torch "
    descriptions = (redis.hget(key, "description") for key in redis.scan_iter("rq:job:*") if key.count(b":") == 2)
    return sorted(text.decode() for text in descriptions if text and text.decode().startswith(wanted))


def test_an_open_bug_is_re_tested_on_a_newly_offered_torch_and_marked_fixed(
        fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    fleet.start_second_worker()
    with fleet.service.client() as client:
        bug_id = client.get("/v1/bugs", params={"status": "open"}).json()["bugs"][0]["id"]
        deadline = time.monotonic() + 120
        while (bug := client.get(f"/v1/bugs/{bug_id}").json())["status"] != "fixed":
            assert time.monotonic() < deadline, f"the bug was never re-tested on 2.14.1: {bug}"
            time.sleep(0.3)
        fixed = client.get("/v1/bugs", params={"status": "fixed"}).json()
        still_open = client.get("/v1/bugs", params={"status": "open"}).json()

    assert bug["fixed_in"] == "2.14.1" and bug["affected"] == [OWN]
    assert bug["fixed_evidence"] == {"job": bug["representative"], "torch": "2.14.1", "how": "re-test"}
    assert bug["versions_tried"] == {"2.12.0": "passes", OWN: "same", "2.14.1": "passes"}
    assert [listed["id"] for listed in fixed["bugs"]] == [bug_id] and still_open["total"] == 0
    assert client_main(["bugs", "--server", fleet.service.url, "--status", "fixed"]) == 0
    listing = capsys.readouterr().out
    assert bug_id in listing and "fixed in 2.14.1" in listing


def test_workers_list_the_torch_versions_they_hold_and_metrics_count_them(fleet: Fleet) -> None:
    with fleet.service.client() as client:
        body = _wait_for_versions(client, {"2.12.0", OWN, "2.14.1"})
        metrics = client.get("/metrics").text

    held = {worker["name"]: sorted(install["torch"] for install in worker["torch"]) for worker in body["workers"]}
    assert held["second"] == sorted([OWN, "2.14.1"])
    assert sorted(held.values()) == sorted([sorted([OWN, "2.12.0"]), sorted([OWN, "2.14.1"])])
    assert body["versions"] == dict(sorted({OWN: 2, "2.12.0": 1, "2.14.1": 1}.items()))
    second = next(worker for worker in body["workers"] if worker["name"] == "second")
    assert "minify-torch-2.14.1" in second["queues"]
    assert f'minify_worker_torch_versions{{torch="{OWN}"}} 2.0' in metrics
    assert 'minify_worker_torch_versions{torch="2.14.1"} 1.0' in metrics


def test_probes_fan_out_to_the_worker_that_holds_the_version_and_say_where_it_was_fixed(
        fleet: Fleet, programs: dict[str, Path]) -> None:
    with fleet.service.client() as client:
        job_id = submit(client, programs["relu_cos"], SPEC)
        done = wait_for_culprit(client, job_id, timeout_s=240)
        report = client.get(f"/v1/jobs/{job_id}/artifacts/report.json").json()
    redis = Redis.from_url(fleet.service.redis_url)

    assert done["status"] == "succeeded", done
    outcomes = [(run["torch"], run["outcome"]) for run in report["versions"]]
    assert outcomes == [("2.12.0", "passes"), (OWN, "same"), ("2.14.1", "passes")]
    assert report["regression_range"] == {"last_good": "2.12.0", "first_bad": OWN}
    assert report["fixed_in"] == "2.14.1"
    assert report["versions_summary"] == (
        f"fails on {OWN}; passes on 2.12.0, 2.14.1: regression in (2.12.0, {OWN}]; fixed in 2.14.1")
    # 2.14.1 went through its queue to the second worker, the one that holds it.
    assert Job.fetch(probe_job_id(job_id, "2.14.1"), connection=redis).worker_name == "second"


def test_no_versions_skips_the_phase(fleet: Fleet, programs: dict[str, Path]) -> None:
    with fleet.service.client() as client:
        job_id = submit(client, programs["relu_cos"], {**SPEC, "versions": False})
        done = wait_for_culprit(client, job_id, timeout_s=120)
        report = client.get(f"/v1/jobs/{job_id}/artifacts/report.json").json()
    redis = Redis.from_url(fleet.service.redis_url)

    assert done["status"] == "succeeded"
    assert report["versions"] == [] and report["versions_state"] is None and report["versions_summary"] is None
    with pytest.raises(NoSuchJobError):
        Job.fetch(probe_job_id(job_id, "2.14.1"), connection=redis)


def test_a_bisection_on_demand_runs_on_a_worker_with_an_index_and_the_client_follows_it(fleet: Fleet) -> None:
    """The index's stand-in torch cannot run a real repro.py: the bisection stops at its good end, said
    so, after the route, the bisect queue, the worker, the job record and the client all took part."""
    with fleet.service.client() as client:
        job_id = client.get("/v1/jobs", params={"status": "succeeded"}).json()["jobs"][0]["id"]
        refused = client.post(f"/v1/jobs/{job_id}/bisect", json={"good": "9.0.0"})

    done = run_cli("bisect", job_id, "--good", "9.0.0", "--bad", "9.1.0", "--server", fleet.service.url, timeout=120)
    with fleet.service.client() as client:
        bisection = client.get(f"/v1/jobs/{job_id}").json()["result"]["bisect"]
        report = client.get(f"/v1/jobs/{job_id}/artifacts/report.json").json()

    assert refused.status_code == 422
    assert done.returncode == 1, done.stdout + done.stderr
    assert bisection["state"] == "failed" and bisection["installs"] == 1
    assert bisection["reason"].startswith("the good end 9.0.0 does not pass: it cannot run the repro")
    assert bisection["releases"] == ["9.0.0", "9.1.0"] and report["bisect"] == bisection
    assert done.stdout.splitlines()[-1] == f"bisection 9.0.0..9.1.0 stopped: {bisection['reason']}"
