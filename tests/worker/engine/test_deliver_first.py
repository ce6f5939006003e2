"""Deliver first, confirm after (issue 40): where the spec says which failure is meant (its
signature, or an accuracy failure) and a candidate shows it, the job delivers its result while the
original still runs; the original's verdict follows it into report.json (`original_state`
`confirmed`, or `not_reproduced` with what the original did, the result kept). Without a known
failure the job waits for the verdict as before.

Real engine, real sandbox children; the test backends make the whole program slow (5 s, `WHOLE_PROGRAM_S`) while its
parts fail at once, so the order of events is the point of each test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from minify_contract.models import JobSpec, JobState, Milestone, OriginalState, ProgressEvent
from minify_worker.engine import MinifyResult, minify
from tests.support.backends import ALLOWED, PREFIX
from tests.support.graphs import ops_of, save_chain, save_cos_sin_relu

RELU = "RuntimeError: injected failure on relu"
COS = "ValueError: injected failure on cos"

pytestmark = pytest.mark.waits


def run(tmp_path: Path, backend: str, failure: dict, *, culprit: bool = False, program: Path | None = None,
        on_result: object = None) -> tuple[MinifyResult, list[MinifyResult], list[ProgressEvent]]:
    spec = JobSpec.model_validate({"backend": f"{PREFIX}:{backend}", "failure": failure,
                                   "limits": {"parallelism": 2}, "shrink": False, "culprit": culprit})
    events: list[ProgressEvent] = []
    delivered: list[MinifyResult] = []

    def deliver(result: MinifyResult) -> None:
        delivered.append(result)
        if callable(on_result):
            on_result(result)

    result = minify(program or save_cos_sin_relu(tmp_path), spec, tmp_path / "out", on_event=events.append,
                    on_result=deliver)
    return result, delivered, events


def milestones(events: list[ProgressEvent]) -> list[Milestone]:
    return [event.milestone for event in events if event.milestone is not None]


def report_json(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "out" / "report.json").read_text())


@pytest.mark.parametrize(("backend", "failure", "culprit"), [
    ("fail_on_relu_slowly_when_whole", {"signature": RELU}, True),
    ("wrong_on_relu_slowly_when_whole", {"kind": "accuracy"}, False),
], ids=["given-signature", "accuracy"])
def test_a_known_failure_is_delivered_before_the_originals_verdict_which_then_confirms_it(
        tmp_path: Path, test_backends_allowed: None, backend: str, failure: dict, culprit: bool) -> None:
    result, delivered, events = run(tmp_path, backend, failure, culprit=culprit)

    assert result.status is JobState.succeeded, result.reason
    assert len(delivered) == 1 and delivered[0].status is JobState.succeeded
    assert delivered[0].report.original_state is OriginalState.running
    assert ops_of(delivered[0].report.graph_code) == ["relu"]
    steps = milestones(events)
    assert Milestone.reproduced not in steps[:steps.index(Milestone.finished)]
    assert steps.index(Milestone.finished) < steps.index(Milestone.original_confirmed)
    if culprit:
        assert steps.index(Milestone.original_confirmed) < steps.index(Milestone.culprit_started)
    assert result.report.original_state is OriginalState.confirmed and result.report.original_verdict is None
    # A compile error is one run, a wrong result three; every run failed.
    assert result.report.original_runs >= 1 and result.report.original_failures == result.report.original_runs
    assert not result.report.flaky
    assert result.report.reason is None and result.report.signature == delivered[0].report.signature
    assert result.report.phase_s["original"] > 0
    assert report_json(tmp_path)["original_state"] == "confirmed"
    # The delivered result came before the whole program's 5 s compile ended.
    confirmed = next(event for event in events if event.milestone is Milestone.original_confirmed)
    assert delivered[0].report.elapsed_s < confirmed.elapsed_s


@pytest.mark.parametrize(("backend", "given", "minimal", "original_did"), [
    ("fail_on_relu_unless_whole", RELU, ["relu"], "passes 3x"),
    ("fail_on_relu_slowly_or_at_once_on_cos", COS, ["cos"], f"fails with {RELU}"),
], ids=["original-passes", "original-fails-otherwise"])
def test_an_original_that_contradicts_a_shown_failure_leaves_the_result_and_says_so(
        tmp_path: Path, test_backends_allowed: None, backend: str, given: str, minimal: list[str],
        original_did: str) -> None:
    # A candidate fails with the given signature while the whole program (5 s) does not: whenever
    # the verdict comes, before the delivery or after it, the minimal program is kept.
    result, _, events = run(tmp_path, backend, {"signature": given})

    assert result.status is JobState.succeeded, result.reason
    assert ops_of(result.report.graph_code) == minimal and result.report.signature == given
    assert result.report.original_state is OriginalState.not_reproduced
    assert original_did in (result.report.original_verdict or "")
    assert "the result is kept, though the original's verdict contradicts it" in (result.reason or "")
    assert Milestone.original_not_reproduced in milestones(events)
    assert report_json(tmp_path)["original_state"] == "not_reproduced"
    assert "# Original:         not_reproduced: " in (tmp_path / "out" / "repro.py").read_text()


def test_the_verdict_of_an_original_that_passes_follows_the_delivery(
        tmp_path: Path, test_backends_allowed: None) -> None:
    result, delivered, events = run(tmp_path, "fail_on_relu_unless_whole", {"signature": RELU})

    assert [done.report.original_state for done in delivered] == [OriginalState.running]
    assert delivered[0].report.reason is None
    steps = milestones(events)
    assert steps.index(Milestone.finished) < steps.index(Milestone.original_not_reproduced)
    assert result.report.original_state is OriginalState.not_reproduced


def test_without_a_known_failure_the_job_waits_for_the_originals_verdict(
        tmp_path: Path, test_backends_allowed: None) -> None:
    result, delivered, events = run(tmp_path, "fail_on_relu_slowly_when_whole", {"kind": "compile_error"})

    assert result.status is JobState.succeeded, result.reason
    assert delivered == []  # nothing follows the result: it is the final one
    steps = milestones(events)
    assert steps.index(Milestone.reproduced) < steps.index(Milestone.finished)
    assert Milestone.original_confirmed not in steps
    assert result.report.original_state is OriginalState.confirmed
    assert "original" not in result.report.phase_s


def test_a_given_signature_no_candidate_shows_ends_with_the_originals_verdict(
        tmp_path: Path, test_backends_allowed: None) -> None:
    # Nothing fails with the given ValueError: there is no result to keep, and the original's
    # own failure (relu's RuntimeError) is not the one named.
    result, delivered, _ = run(tmp_path, "fail_on_relu", {"signature": COS},
                               program=save_chain(tmp_path, ("sin", "cos", "relu", "exp")))

    assert result.status is JobState.not_reproducible and delivered == []
    assert result.report.original_state is OriginalState.not_reproduced
    assert f"fails with {RELU}" in (result.reason or "")


def test_a_cancel_while_the_verdict_is_out_stops_it_and_the_result_stays(
        tmp_path: Path, test_backends_allowed: None) -> None:
    cancel = threading.Event()
    spec = JobSpec.model_validate({"backend": f"{PREFIX}:fail_on_relu_slowly_when_whole",
                                   "failure": {"signature": RELU}, "limits": {"parallelism": 2},
                                   "shrink": False, "culprit": False})

    result = minify(save_cos_sin_relu(tmp_path), spec, tmp_path / "out", cancel=cancel,
                    on_result=lambda delivered: cancel.set())

    assert result.status is JobState.succeeded and ops_of(result.report.graph_code) == ["relu"]
    assert result.report.original_state is OriginalState.stopped
    assert "cancelled" in (result.report.original_verdict or "")
    assert report_json(tmp_path)["original_state"] == "stopped"


def test_the_offline_command_prints_the_result_then_the_originals_verdict(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "minify_worker.cli", "minify", str(save_cos_sin_relu(tmp_path)),
         "--out", str(tmp_path / "out"), "--backend", f"{PREFIX}:fail_on_relu_slowly_when_whole",
         "--signature", RELU, "--no-shrink", "--no-culprit", "--parallelism", "2", "--quiet"],
        capture_output=True, text=True, timeout=300, env={**os.environ, **ALLOWED})

    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    result = next(index for index, line in enumerate(lines) if line.startswith("status: succeeded"))
    assert lines[result + 1:].index("original: running (its verdict follows the delivered result)") >= 0
    assert lines[-1] == "original: confirmed (failed 1 of 1 runs)"  # no culprit line follows: no phase ran
