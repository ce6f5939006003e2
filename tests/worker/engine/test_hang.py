"""The hang watch (engine/hang.py): how a hang is told and timed when no timeout is given, driven
with made-up outcomes, a fake evaluator and a back-dated original: no sandbox, no compile. The
engine's hang jobs end to end are in test_engine.py."""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

import pytest

from minify_contract.models import JobSpec, Milestone
from minify_worker import oracle
from minify_worker.engine.hang import (
    HANG_TIMEOUT_FACTOR,
    MIN_HANG_TIMEOUT_S,
    HangCalibration,
    HangState,
    HangWatch,
    Refuted,
)
from minify_worker.outcomes import Fails, Outcome, Passes, Signature, TimedOut

pytestmark = pytest.mark.fast

HANG = oracle.outcome_signature(TimedOut(40.0))
RELU = Signature(kind="compile_error", exc_type="RuntimeError", key="injected failure on relu")
# Small floors, as tests scale them down: the original counts as a hang after 10x what passing
# runs predict (at least 1 s); the result is confirmed with 10x the slowest passing run (at least 2 s).
CALIBRATION = HangCalibration(original_factor=10.0, original_min_s=1.0, confirm_factor=10.0, confirm_min_s=2.0)


def done(outcome: Outcome) -> Future[Outcome]:
    future: Future[Outcome] = Future()
    future.set_result(outcome)
    return future


class FakeEvaluator:
    """Runs nothing: each submit answers the next of `answers`; what it was asked is kept."""

    def __init__(self, *answers: Outcome) -> None:
        self.answers = list(answers)
        self.submitted: list[tuple[Any, float | None]] = []
        self.cancelled: list[Future[Outcome]] = []

    def submit(self, graph: Any, timeout_s: float | None = None, runs: int = 1,
               output: bool = False) -> Future[Outcome]:
        self.submitted.append((graph, timeout_s))
        return done(self.answers.pop(0))

    def cancel(self, future: Future[Outcome]) -> None:
        self.cancelled.append(future)


class Watched:
    """A HangWatch with what the engine gives it recorded: the timeouts it shortened candidates
    to, the steps it told; `state` is the hang state the engine answers."""

    def __init__(self, state: HangState | None = None, calibration: HangCalibration = CALIBRATION,
                 **limits: float) -> None:
        self.state = state
        self.shortened: list[float] = []
        self.said: list[tuple[Milestone, str]] = []
        spec = JobSpec.model_validate({"failure": {"kind": "any"}, "limits": limits})
        self.watch = HangWatch(calibration, spec, hang_state=lambda: self.state, shorten=self.shortened.append,
                               say=lambda milestone, message: self.said.append((milestone, message)),
                               count_ops=len)

    def original_running_for(self, seconds: float, evaluator: FakeEvaluator | None = None,
                             nodes_original: int = 20) -> Future[Outcome]:
        """The original, submitted `seconds` ago and still running."""
        running: Future[Outcome] = Future()
        self.watch.watch(evaluator or FakeEvaluator(), running, time.monotonic() - seconds, nodes_original)
        return running


def test_a_hang_may_be_guessed_only_when_no_timeout_is_given() -> None:
    assert Watched().watch.may_guess
    assert not Watched(candidate_timeout_s=30).watch.may_guess
    assert not Watched(original_timeout_s=30).watch.may_guess
    spec = JobSpec.model_validate({"failure": {"kind": "compile_error"}})
    assert not HangWatch(CALIBRATION, spec, hang_state=lambda: None, shorten=print, say=print,
                         count_ops=len).may_guess


def test_passing_runs_shorten_the_timeout_of_a_known_hang_to_a_multiple_of_the_slowest() -> None:
    watched = Watched(state="known")

    watched.watch.observe(["op"] * 3, Passes(duration_s=2.0))
    assert watched.shortened == []  # one passing run does not calibrate a known hang
    watched.watch.observe(["op"] * 5, Passes(duration_s=3.0))

    assert watched.shortened == [HANG_TIMEOUT_FACTOR * 3.0]
    assert watched.watch.passes == [(3, 2.0), (5, 3.0)]


def test_a_guessed_hang_is_calibrated_from_one_passing_run() -> None:
    watched = Watched(state="guessed")

    watched.watch.observe(["op"], Passes(duration_s=4.0))

    assert watched.shortened == [HANG_TIMEOUT_FACTOR * 4.0]


def test_the_calibrated_timeout_is_never_below_the_floor() -> None:
    watched = Watched(state="known")

    watched.watch.observe(["op"], Passes(duration_s=0.1))
    watched.watch.observe(["op"], Passes(duration_s=0.2))

    assert watched.shortened == [MIN_HANG_TIMEOUT_S]


def test_a_calibration_s_candidate_floor_replaces_the_default_floor() -> None:
    watched = Watched(state="known", calibration=HangCalibration(candidate_min_s=1.5))

    watched.watch.observe(["op"], Passes(duration_s=0.1))
    watched.watch.observe(["op"], Passes(duration_s=0.2))

    assert watched.shortened == [1.5]


def test_without_a_hang_passing_runs_are_kept_but_change_no_timeout() -> None:
    watched = Watched(state=None)

    watched.watch.observe(["op"], Passes(duration_s=1.0))
    watched.watch.observe(["op"], Passes(duration_s=1.0))
    watched.watch.observe(["op"], Fails(RELU))  # only passing runs calibrate

    assert watched.shortened == [] and len(watched.watch.passes) == 2


def test_the_original_is_guessed_a_hang_once_it_ran_the_factor_times_what_passing_runs_predict_for_its_size(
) -> None:
    watched = Watched()
    watched.watch.observe(["op"] * 2, Passes(duration_s=0.5))  # 0.25 s an op: 20 ops predict 5 s, 10x is 50 s
    adopted: list[TimedOut] = []

    def adopt(outcome: TimedOut) -> Signature:
        adopted.append(outcome)
        return HANG

    watched.original_running_for(40.0)
    watched.watch.poll(False, adopt)
    assert adopted == [] and watched.said == []

    watched.original_running_for(60.0)
    watched.watch.poll(False, adopt)
    assert len(adopted) == 1 and adopted[0].after_s >= 60.0
    assert [milestone for milestone, _ in watched.said] == [Milestone.hang_guessed]
    assert watched.shortened == [MIN_HANG_TIMEOUT_S]  # candidates now hang after the calibrated timeout


def test_no_hang_is_guessed_while_candidates_are_judged_otherwise_or_before_any_run_passed() -> None:
    watched = Watched()
    watched.original_running_for(1000.0)
    adopt_calls: list[TimedOut] = []

    watched.watch.poll(False, adopt_calls.append)  # no passing run yet: nothing predicts the original's time
    watched.watch.observe(["op"], Passes(duration_s=0.1))
    watched.watch.poll(True, adopt_calls.append)  # the original's failure is known, or another guess stands

    assert adopt_calls == []


def test_a_hang_that_cannot_be_the_target_is_never_guessed_again() -> None:
    watched = Watched()
    watched.watch.observe(["op"], Passes(duration_s=0.1))
    watched.original_running_for(1000.0)

    watched.watch.poll(False, lambda outcome: None)

    assert not watched.watch.may_guess and watched.said == []


def test_a_result_that_still_runs_at_the_confirm_timeout_confirms_the_hang_and_stops_the_original() -> None:
    watched = Watched(state="guessed")
    watched.watch.observe(["op"], Passes(duration_s=0.5))
    evaluator = FakeEvaluator(TimedOut(5.0))
    original = watched.original_running_for(100.0, evaluator)

    outcome = watched.watch.confirm(["op"], HANG, remaining_s=600.0, wait_for=lambda futures: None)

    assert isinstance(outcome, TimedOut) and outcome.after_s >= 100.0
    assert evaluator.submitted == [(["op"], 5.0)]  # 10x the slowest passing run, above the 2 s floor
    assert evaluator.cancelled == [original]
    assert watched.watch.confirm_timeout_s == 5.0
    assert [m for m, _ in watched.said] == [Milestone.hang_confirming, Milestone.hang_confirmed]


def test_the_confirm_timeout_has_a_floor_and_never_outlasts_the_job() -> None:
    watched = Watched(state="guessed")
    watched.watch.observe(["op"], Passes(duration_s=0.01))
    evaluator = FakeEvaluator(TimedOut(2.0), TimedOut(1.5))
    watched.original_running_for(100.0, evaluator)

    watched.watch.confirm(["op"], HANG, remaining_s=600.0, wait_for=lambda futures: None)
    watched.watch.confirm(["op"], HANG, remaining_s=1.5, wait_for=lambda futures: None)

    assert [timeout for _, timeout in evaluator.submitted] == [CALIBRATION.confirm_min_s, 1.5]


def test_a_result_that_finishes_within_the_confirm_timeout_refutes_the_guess() -> None:
    watched = Watched(state="guessed")
    watched.watch.observe(["op"], Passes(duration_s=0.5))
    evaluator = FakeEvaluator(Passes(duration_s=0.5))
    watched.original_running_for(100.0, evaluator)

    outcome = watched.watch.confirm(["op"], HANG, remaining_s=600.0, wait_for=lambda futures: None)

    assert isinstance(outcome, Refuted) and "reducing again from the original" in outcome.reason
    assert evaluator.cancelled == [] and not watched.watch.may_guess


def test_the_originals_own_outcome_decides_when_it_came_during_the_confirmation() -> None:
    watched = Watched(state="guessed")
    watched.watch.observe(["op"], Passes(duration_s=0.5))
    evaluator = FakeEvaluator(TimedOut(5.0))
    original = watched.original_running_for(100.0, evaluator)
    original.set_result(Fails(RELU))

    outcome = watched.watch.confirm(["op"], HANG, remaining_s=600.0, wait_for=lambda futures: None)

    assert outcome == Fails(RELU) and evaluator.cancelled == []
