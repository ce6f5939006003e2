"""Result first, the culprit follows: a job is `succeeded` with its artifacts before its culprit
phase runs; the phase's finding then reaches report.json, repro.py, the job record and the event
stream. A cancel during the phase stops the phase only; a worker killed during it loses the
culprit, not the job.

Everything is real: minify-server with its embedded Redis and an RQ worker, the engine and its
sandbox children, `minify-client` as a subprocess. The test backends make the culprit phase slow
(its screen of `pattern_matcher=False` sleeps) while the job itself takes seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from minify_contract.models import CulpritState, JobState, ProgressEvent, Report
from tests.client.test_client_cli import sigint_as_on_a_terminal
from tests.support.backends import PREFIX
from tests.support.graphs import save_cos_sin_relu
from tests.support.scripted_server import Exchange, ScriptedServer, job_status, serve_job
from tests.support.service import Service, read_events, start_service, wait_for_culprit, wait_for_status
from tests.worker.service.test_service import submit, work_horse_of

SLOW_CULPRIT = {"backend": f"{PREFIX}:fail_on_relu_slow_culprit", "failure": {"kind": "compile_error"}}
# Its pattern_matcher screen sleeps past the probe timeout: a phase of 10 s or more.
SLOWER_CULPRIT = {**SLOW_CULPRIT, "backend": f"{PREFIX}:fail_on_relu_slower_culprit"}
FINISHED = {"succeeded", "not_reproducible", "failed", "cancelled"}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    # The tests' floor of 5 s for the phase's budget (tests/conftest.py) would end it by itself.
    with start_service(tmp_path_factory.mktemp("service") / "data", workers=1,
                       env={"MINIFY_CULPRIT_MIN_BUDGET_S": "60"}) as running:
        yield running


def test_the_job_succeeds_with_its_artifacts_before_the_culprit_which_then_arrives(
        service: Service, programs: dict[str, Path]) -> None:
    with service.client() as client:
        job_id = submit(client, programs["relu_cos"], SLOW_CULPRIT)
        delivered = wait_for_status(client, job_id, FINISHED)
        delivered_report = client.get(f"/v1/jobs/{job_id}/artifacts/report.json").json()
        repro = client.get(f"/v1/jobs/{job_id}/artifacts/repro.py")
        done = wait_for_culprit(client, job_id)
        final_report = client.get(f"/v1/jobs/{job_id}/artifacts/report.json").json()
        final_repro = client.get(f"/v1/jobs/{job_id}/artifacts/repro.py").text
        events = read_events(client, job_id, timeout_s=30)

    assert delivered["status"] == "succeeded", delivered
    assert delivered["culprit_state"] == "running" and delivered["result"]["culprit_state"] == "running"
    assert delivered_report["culprit_state"] == "running"
    assert delivered_report["culprit_reason"].startswith("pending")
    assert repro.status_code == 200 and "# Culprit:          pending" in repro.text
    assert done["status"] == "succeeded" and done["culprit_state"] == "done"
    assert done["result"]["culprit_state"] == "done" and "culprit" in done["result"]["phase_s"]
    assert "pattern_matcher=False" in done["result"]["workarounds_tried"]
    assert final_report["culprit_state"] == "done" and "no stages" in final_report["culprit_reason"]
    assert "pending" not in final_repro and "# Culprit:          none: the custom backend" in final_repro
    # The stream goes on past the succeeded status (culprit_state running) to the culprit event, its last.
    kinds = [(event.event, event.data.get("status"), event.data.get("culprit_state")) for event in events]
    assert ("status", "succeeded", "running") in kinds
    assert kinds[-1] == ("culprit", None, "done")
    assert kinds.index(("status", "succeeded", "running")) < len(kinds) - 1


def test_a_cancel_during_the_culprit_phase_stops_it_and_the_job_stays_succeeded(
        service: Service, programs: dict[str, Path]) -> None:
    with service.client() as client:
        job_id = submit(client, programs["relu_cos"], SLOWER_CULPRIT)
        delivered = wait_for_status(client, job_id, FINISHED)
        cancelled = client.delete(f"/v1/jobs/{job_id}")
        started = time.monotonic()
        ended = wait_for_culprit(client, job_id, timeout_s=30)
        stopped_after_s = time.monotonic() - started
        report = client.get(f"/v1/jobs/{job_id}/artifacts/report.json").json()
        artifact = client.get(f"/v1/jobs/{job_id}/artifacts/minimized.pt2")

    assert delivered["status"] == "succeeded" and delivered["culprit_state"] == "running"
    assert cancelled.status_code == 202, cancelled.text
    assert ended["status"] == "succeeded" and ended["culprit_state"] == "cancelled"
    assert ended["result"]["culprit_reason"].startswith("cancelled")
    assert report["culprit_state"] == "cancelled"
    assert artifact.status_code == 200
    assert stopped_after_s < 8  # the probe sleeping 120 s (cut at its timeout) did not run out


def test_a_work_horse_killed_during_the_culprit_phase_leaves_a_succeeded_job_whose_culprit_is_lost(
        service: Service, programs: dict[str, Path]) -> None:
    with service.client() as client:
        job_id = submit(client, programs["relu_cos"], SLOWER_CULPRIT)
        running = wait_for_status(client, job_id, {"running"})
        horse = work_horse_of(running)
        delivered = wait_for_status(client, job_id, FINISHED)
        os.kill(horse, signal.SIGKILL)
        ended = wait_for_culprit(client, job_id, timeout_s=60)
        time.sleep(1.0)  # RQ's own handling of the dead horse comes after: the job must stay as it is
        after = client.get(f"/v1/jobs/{job_id}").json()
        report = client.get(f"/v1/jobs/{job_id}/artifacts/report.json").json()
        repro = client.get(f"/v1/jobs/{job_id}/artifacts/repro.py").text

    assert delivered["status"] == "succeeded" and delivered["culprit_state"] == "running"
    assert ended["status"] == "succeeded" and ended["culprit_state"] == "lost", ended
    assert ended["result"]["culprit_reason"].startswith("lost: work horse killed by SIGKILL")
    assert (after["status"], after["culprit_state"], after["attempts"]) == ("succeeded", "lost", 1)
    assert report["culprit_state"] == "lost"
    assert "pending" not in repro, repro[:1500]
    assert "# Culprit:          none: lost: work horse killed by SIGKILL" in repro, repro[:1500]


def test_submit_wait_prints_the_result_then_the_culprit_and_refreshes_the_files(
        service: Service, programs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {key: value for key, value in os.environ.items() if key not in ("MINIFY_SERVER", "MINIFY_TOKEN")}
    done = subprocess.run(
        [sys.executable, "-m", "minify_client.cli", "submit", str(programs["relu_cos"]), "--server", service.url,
         "--backend", SLOW_CULPRIT["backend"], "--failure", "compile_error", "--force", "--wait", "--out", str(out)],
        capture_output=True, text=True, timeout=180, env=env)
    lines = done.stdout.splitlines()

    assert done.returncode == 0, done.stdout + done.stderr
    result = next(index for index, line in enumerate(lines) if line.startswith("succeeded:"))
    pending = next(index for index, line in enumerate(lines) if line.startswith("culprit: pending"))
    # One line for the phase's start, not a guess at a bisection this backend has none of
    waiting = [index for index, line in enumerate(lines) if line.startswith("culprit: the repro is delivered")]
    assert len(waiting) == 1 and not any("bisecting" in line for line in lines), lines
    waiting = waiting[0]
    found = next(index for index, line in enumerate(lines) if line.startswith("culprit: none (the custom backend"))
    assert result < pending < waiting < found
    assert f"report.json and repro.py in {out} now carry the culprit" in done.stdout
    assert json.loads((out / "report.json").read_text())["culprit_state"] == "done"
    assert "pending" not in (out / "repro.py").read_text()


def test_ctrl_c_while_only_the_culprit_is_pending_exits_0_with_the_repro_saved(
        server: ScriptedServer, program: Path, tmp_path: Path) -> None:
    # A scripted server: job j1 succeeded, its culprit phase running and never ending.
    status = job_status("j1", JobState.succeeded, artifacts=["repro.py", "report.json"])
    assert status.result is not None
    report = status.result.model_copy(update={"culprit_state": CulpritState.running})
    status = status.model_copy(update={"culprit_state": CulpritState.running, "result": report})
    files = {"repro.py": b"raise SystemExit(1)\n", "report.json": report.model_dump_json().encode()}
    serve_job(server, status, [], files)

    def culprit_pending(exchange: Exchange) -> None:
        exchange.start_events()
        exchange.send_event("1", ProgressEvent(type="status", status=JobState.succeeded,
                                               culprit_state=CulpritState.running))
        time.sleep(30)

    server.route("GET", "/v1/jobs/j1/events", culprit_pending)
    out = tmp_path / "out"
    with sigint_as_on_a_terminal():
        process = subprocess.Popen(
            [sys.executable, "-m", "minify_client.cli", "submit", str(program), "--wait", "--out", str(out),
             "--server", server.url],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={key: value for key, value in os.environ.items() if key not in ("MINIFY_SERVER", "MINIFY_TOKEN")})
    # A live line that never comes ends the wait in a minute, not at pytest's timeout: the client
    # follows a running culprit phase for as long as the server says it runs.
    watchdog = threading.Timer(60, process.kill)
    watchdog.start()
    try:
        assert process.stdout is not None
        shown = []
        for line in process.stdout:
            shown.append(line)
            if line.startswith("culprit: the repro is delivered"):  # the live line, waiting
                break
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    finally:
        watchdog.cancel()
        process.kill()

    assert any(line.startswith("culprit: the repro is delivered") for line in shown), shown
    assert process.returncode == 0, stderr
    assert any(line.startswith("succeeded:") for line in shown)
    assert "stopped waiting for the culprit; the repro is saved" in stderr
    assert f"{out / 'report.json'} after `minify-client download j1`" in stderr
    assert (out / "repro.py").read_text() == "raise SystemExit(1)\n"
    assert Report.model_validate_json((out / "report.json").read_text()).culprit_state is CulpritState.running
    assert server.requests_to("DELETE", "/v1/jobs/j1") == []


# The offline command's result first and its culprit after: tests/worker/test_offline_out.py, on
# its run of the command.


# -- the original's verdict follows the result too, where the failure was known (issue 40) --------

# Two children at once: the original's slow run in one, the reduction beside it.
SLOW_ORIGINAL = {"backend": f"{PREFIX}:fail_on_relu_slowly_when_whole",
                 "failure": {"signature": "RuntimeError: injected failure on relu"}, "shrink": False,
                 "limits": {"parallelism": 2}}


def test_the_originals_verdict_follows_the_delivered_result_into_the_record_and_the_stream(
        service: Service, tmp_path: Path) -> None:
    with service.client() as client:
        job_id = submit(client, save_cos_sin_relu(tmp_path), SLOW_ORIGINAL)
        delivered = wait_for_status(client, job_id, FINISHED)
        done = wait_for_culprit(client, job_id)
        report = client.get(f"/v1/jobs/{job_id}/artifacts/report.json").json()
        events = read_events(client, job_id, timeout_s=30)

    assert delivered["status"] == "succeeded" and delivered["result"]["original_state"] == "running"
    assert done["status"] == "succeeded" and done["result"]["original_state"] == "confirmed"
    assert report["original_state"] == "confirmed" and report["culprit_state"] == "done"
    steps = [(event.event, event.data.get("status"), event.data.get("milestone")) for event in events]
    delivery = steps.index(("status", "succeeded", None))
    assert delivery < steps.index(("progress", None, "original_confirmed")) < steps.index(
        ("progress", None, "culprit_started"))


def test_a_work_horse_killed_while_the_verdict_is_out_leaves_the_result_and_the_verdict_lost(
        service: Service, tmp_path: Path) -> None:
    with service.client() as client:
        job_id = submit(client, save_cos_sin_relu(tmp_path), {**SLOW_ORIGINAL, "culprit": False})
        running = wait_for_status(client, job_id, {"running"})
        horse = work_horse_of(running)
        delivered = wait_for_status(client, job_id, FINISHED)
        os.kill(horse, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while (after := client.get(f"/v1/jobs/{job_id}").json())["result"]["original_state"] == "running":
            assert time.monotonic() < deadline, after
            time.sleep(0.2)

    assert delivered["status"] == "succeeded" and delivered["result"]["original_state"] == "running"
    assert after["status"] == "succeeded" and after["culprit_state"] == "skipped"
    assert after["result"]["original_state"] == "lost"
    assert after["result"]["original_verdict"].startswith("no verdict: work horse killed by SIGKILL")
