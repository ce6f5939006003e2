"""Candidates are judged while the original still runs, against the first candidate failure of
the kind asked for; if the original then fails otherwise, the reduction starts over
(verdict.Verdict.provisional)."""

from __future__ import annotations

from pathlib import Path

import pytest

from minify_contract.models import JobSpec, JobState, Milestone, ProgressEvent
from minify_worker.engine import minify
from tests.support.backends import PREFIX
from tests.support.graphs import ops_of, save_cos_sin_relu

pytestmark = pytest.mark.waits


def run(tmp_path: Path, backend: str, failure: dict | None = None) -> tuple[object, list[ProgressEvent]]:
    program = save_cos_sin_relu(tmp_path)
    spec = JobSpec.model_validate({"backend": f"{PREFIX}:{backend}", "failure": failure or {},
                                   "limits": {"parallelism": 2}, "shrink": False})
    events: list[ProgressEvent] = []
    return minify(program, spec, tmp_path / "out", on_event=events.append), events


def test_candidates_are_accepted_before_the_original_has_failed(tmp_path: Path, test_backends_allowed: None) -> None:
    result, events = run(tmp_path, "fail_on_relu_slowly_when_whole")

    assert result.status is JobState.succeeded, result.reason
    assert ops_of(result.report.graph_code or "") == ["relu"]
    assert result.report.signature == "RuntimeError: injected failure on relu"
    reproduced = next(i for i, event in enumerate(events) if event.milestone is Milestone.reproduced)
    shrunk_before = [event for event in events[:reproduced]
                     if event.nodes_current is not None and event.nodes_current < (event.nodes_original or 0)]
    assert shrunk_before, "no candidate was accepted while the original ran"


def test_a_guess_the_original_contradicts_restarts_the_reduction(tmp_path: Path, test_backends_allowed: None) -> None:
    result, events = run(tmp_path, "fail_on_relu_slowly_or_at_once_on_cos")

    assert result.status is JobState.succeeded, result.reason
    assert result.report.signature == "RuntimeError: injected failure on relu"
    assert ops_of(result.report.graph_code or "") == ["relu"]
    assert any(event.milestone is Milestone.restarted for event in events)


def test_a_guess_is_only_taken_from_the_failure_kind_asked_for(tmp_path: Path, test_backends_allowed: None) -> None:
    # The original fails at compile time on relu; a candidate with cos alone fails with another
    # compile error, the kind asked for, but `match` says which failure is meant: no restart.
    result, events = run(tmp_path, "fail_on_relu_slowly_or_at_once_on_cos",
                         {"kind": "compile_error", "match": "injected failure on relu"})

    assert result.status is JobState.succeeded, result.reason
    assert ops_of(result.report.graph_code or "") == ["relu"]
    assert not any(event.milestone is Milestone.restarted for event in events)
