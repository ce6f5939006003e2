"""Defaults that work on hangs and memory blow-ups (issue 12, points 6 and 7): cheap test backends,
real sandbox children, the engine end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from minify_contract.models import JobSpec, JobState, Milestone, ProgressEvent
from minify_worker.engine import HangCalibration, minify
from minify_worker.engine.original import DEFAULT_ORIGINAL_TIMEOUT_S
from tests.support.backends import PREFIX
from tests.support.graphs import ops_of, save_chain

pytestmark = [pytest.mark.usefixtures("test_backends_allowed"), pytest.mark.waits]

# The phases after minimality (shrink, culprit) would each run the hanging or allocating minimal
# program again, a timeout apiece: the first test of each failure kind keeps them (the defaults,
# end to end); the others are about the reduction's timeouts and leave them out.
REDUCTION_ONLY = {"shrink": False, "culprit": False}


# The default calibration's floors (30 s before the original counts as a hang, 60 s to confirm, 5 s
# for a hanging candidate) scaled down, so these tests take seconds; docs/bench.md measures the
# defaults on the encoder. Passing candidates take milliseconds here: the candidates' floor is what
# each hanging one costs.
SHORT_HANG = HangCalibration(original_min_s=2.0, confirm_min_s=3.0, candidate_min_s=2.0)


@pytest.fixture(scope="module")
def chain_pt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_chain(tmp_path_factory.mktemp("programs"), ("sin", "cos", "relu", "tanh", "exp", "neg"))


def test_a_hanging_compile_is_minimized_with_the_default_failure_kind(chain_pt2: Path, tmp_path: Path) -> None:
    # The default spec but for a short bound on the original's runs (the default is minutes).
    job = JobSpec.model_validate({"backend": f"{PREFIX}:hang_on_relu",
                                  "limits": {"original_timeout_s": 4, "parallelism": 2}})

    result = minify(chain_pt2, job, tmp_path / "out", hang=SHORT_HANG)

    assert result.status is JobState.succeeded, result.reason
    assert ops_of(result.report.graph_code) == ["relu"]
    assert result.report.signature == "TimedOut"
    # Passing candidates calibrated the timeout down to the floor: each hang costs seconds.
    assert result.report.candidate_timeout_s == SHORT_HANG.candidate_min_s


def test_a_hang_with_no_timeout_given_is_confirmed_on_the_result_without_waiting_out_the_original(
        chain_pt2: Path, tmp_path: Path) -> None:
    job = JobSpec.model_validate({**REDUCTION_ONLY, "backend": f"{PREFIX}:hang_on_relu", "limits": {"parallelism": 2}})
    events: list[ProgressEvent] = []

    result = minify(chain_pt2, job, tmp_path / "out", on_event=events.append, hang=SHORT_HANG)

    assert result.status is JobState.succeeded, result.reason
    assert ops_of(result.report.graph_code) == ["relu"]
    assert result.report.signature == "TimedOut"
    assert result.report.hang_confirm_timeout_s == SHORT_HANG.confirm_min_s  # the floor: passing runs take ms
    assert result.report.candidate_timeout_s == SHORT_HANG.candidate_min_s
    assert result.report.original_runs == 1
    assert result.report.elapsed_s < DEFAULT_ORIGINAL_TIMEOUT_S  # the original was stopped, not waited out
    milestones = [event.milestone for event in events]
    assert Milestone.hang_guessed in milestones
    assert Milestone.hang_confirmed in milestones


def test_a_guessed_hang_does_not_stand_against_a_slow_original_that_passes(chain_pt2: Path, tmp_path: Path) -> None:
    # relu takes 4 s to compile: longer than the guess (2 s) and the candidates' timeout (2 s), no hang.
    job = JobSpec.model_validate({**REDUCTION_ONLY, "backend": f"{PREFIX}:slow_on_relu", "limits": {"parallelism": 2}})
    events: list[ProgressEvent] = []

    result = minify(chain_pt2, job, tmp_path / "out", on_event=events.append, hang=SHORT_HANG)

    assert any(event.milestone is Milestone.hang_guessed for event in events)
    assert result.status is JobState.not_reproducible, result.reason
    assert result.report.hang_confirm_timeout_s is None


def test_a_guessed_hang_the_result_does_not_confirm_restarts_from_the_original(
        chain_pt2: Path, tmp_path: Path) -> None:
    # Candidates with relu take 4 s (past the 2 s timeout: hangs, for now); the original 20 s.
    job = JobSpec.model_validate({**REDUCTION_ONLY, "backend": f"{PREFIX}:slow_on_relu_slowest_when_whole",
                                  "limits": {"parallelism": 2}})
    events: list[ProgressEvent] = []

    result = minify(chain_pt2, job, tmp_path / "out", on_event=events.append,
                    hang=HangCalibration(original_min_s=2.0, confirm_min_s=6.0, candidate_min_s=2.0))

    milestones = [event.milestone for event in events]
    assert Milestone.hang_confirming in milestones
    refuted = next(event for event in events if event.milestone is Milestone.hang_refuted)
    assert "6 s timeout" in (refuted.message or "")
    assert Milestone.restarted in milestones
    assert result.status is JobState.not_reproducible, result.reason  # the original's own outcome: it passes
    assert result.report.hang_confirm_timeout_s is None


def test_a_given_original_timeout_wins_over_the_hang_guess(chain_pt2: Path, tmp_path: Path) -> None:
    job = JobSpec.model_validate({**REDUCTION_ONLY, "backend": f"{PREFIX}:hang_on_relu",
                                  "limits": {"original_timeout_s": 4, "parallelism": 2}})
    events: list[ProgressEvent] = []

    result = minify(chain_pt2, job, tmp_path / "out", on_event=events.append, hang=SHORT_HANG)

    assert result.status is JobState.succeeded, result.reason
    assert ops_of(result.report.graph_code) == ["relu"]
    assert result.report.hang_confirm_timeout_s is None  # the original's own timeout made it a hang
    assert not any(event.milestone is Milestone.hang_guessed for event in events)


def test_a_hang_with_failure_timeout_calibrates_the_candidate_timeout_from_passing_runs(
        chain_pt2: Path, tmp_path: Path) -> None:
    job = JobSpec.model_validate({**REDUCTION_ONLY, "backend": f"{PREFIX}:hang_on_relu",
                                  "failure": {"kind": "timeout"},
                                  "limits": {"candidate_timeout_s": 4, "parallelism": 2}})

    result = minify(chain_pt2, job, tmp_path / "out", hang=SHORT_HANG)

    assert result.status is JobState.succeeded, result.reason
    assert ops_of(result.report.graph_code) == ["relu"]
    # The floor: passing candidates take milliseconds.
    assert result.report.candidate_timeout_s == SHORT_HANG.candidate_min_s


def test_a_compiler_that_eats_all_memory_is_minimized_as_an_oom(chain_pt2: Path, tmp_path: Path) -> None:
    job = JobSpec.model_validate({"backend": f"{PREFIX}:allocate_on_relu", "failure": {"kind": "oom"},
                                  "limits": {"memory_mb": 700, "candidate_timeout_s": 60, "parallelism": 2}})

    result = minify(chain_pt2, job, tmp_path / "out")

    assert result.status is JobState.succeeded, result.reason
    assert ops_of(result.report.graph_code) == ["relu"]
    assert result.report.signature == "OutOfMemory"


def test_any_failure_includes_running_out_of_memory(chain_pt2: Path, tmp_path: Path) -> None:
    job = JobSpec.model_validate({**REDUCTION_ONLY, "backend": f"{PREFIX}:allocate_on_relu",
                                  "limits": {"memory_mb": 700, "candidate_timeout_s": 60, "parallelism": 2}})

    result = minify(chain_pt2, job, tmp_path / "out")

    assert result.status is JobState.succeeded, result.reason
    assert ops_of(result.report.graph_code) == ["relu"]
