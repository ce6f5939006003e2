"""A hang the original showed is held to the original's bound (original.py `_hold_hang_to_bound`):
candidates are judged by a calibrated timeout far shorter than it, so the smallest program past that
timeout may be slow, not hung (a compile whose time grows with the program, pytorch#148073). The
result runs once more with the original's bound; one that ends within it raises the candidates'
timeout and the reduction starts again. Cheap test backends, real sandbox children."""

from __future__ import annotations

from pathlib import Path

import pytest

from minify_contract.models import JobSpec, JobState, Milestone, ProgressEvent
from minify_worker.engine import HangCalibration, minify
from tests.support.backends import PREFIX
from tests.support.graphs import ops_of, save_chain

pytestmark = pytest.mark.usefixtures("test_backends_allowed")

# Candidates hang after 1 s at the least (the default floor, 5 s, would let relu's 2 s compile pass).
SHORT_CANDIDATES = HangCalibration(candidate_min_s=1.0)


def test_a_result_that_is_only_slow_does_not_stand_as_the_hang(tmp_path: Path) -> None:
    program = save_chain(tmp_path, ("sin", "cos", "relu", "tanh", "exp", "neg"))
    # relu alone compiles in 2 s, past the candidates' 1 s and within the original's 4 s; relu with
    # tanh never compiles; anything else at once.
    job = JobSpec.model_validate({"backend": f"{PREFIX}:slow_on_relu_alone_hang_with_tanh",
                                  "failure": {"kind": "timeout"}, "shrink": False, "culprit": False,
                                  "limits": {"original_timeout_s": 4, "parallelism": 2}})
    events: list[ProgressEvent] = []

    result = minify(program, job, tmp_path / "out", on_event=events.append, hang=SHORT_CANDIDATES)

    assert result.status is JobState.succeeded, result.reason
    assert result.report.signature == "TimedOut"
    assert ops_of(result.report.graph_code) == ["relu", "tanh"]  # not relu alone, which ends in 2 s
    refuted = [event.message for event in events if event.milestone is Milestone.hang_refuted]
    assert len(refuted) == 1 and "slow, not hung" in refuted[0], refuted
    assert result.report.candidate_timeout_s == 4  # raised to the original's bound (3x relu's run, at most it)
