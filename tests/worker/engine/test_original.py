"""The original's runs beside the reduction (engine/original.py), driven with made-up outcomes: a
fake evaluator whose runs the test settles, a fake scheduler, a program that is a list of op names.
No sandbox, no compile. What a job does with the verdict end to end is in test_deliver_first.py and
test_engine*.py; the verdict's values alone in test_verdict.py."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any

import pytest

from minify_contract.models import JobSpec, JobState, Milestone, OriginalState
from minify_worker.engine.budget import Budget
from minify_worker.engine.hang import HangCalibration
from minify_worker.engine.original import (
    DEFAULT_ORIGINAL_TIMEOUT_S,
    DEFAULT_TIMEOUT_FAILURE_S,
    MIN_CANDIDATE_TIMEOUT_S,
    ORIGINAL_RUNS,
    TIMEOUT_FACTOR,
    OriginalRun,
)
from minify_worker.engine.report import RunFacts
from minify_worker.engine.verdict import Restart, Unreproduced
from minify_worker.oracle import TIMEOUT_SIGNATURE
from minify_worker.outcomes import Fails, Outcome, Passes, Signature

pytestmark = pytest.mark.fast

RELU = Signature(kind="compile_error", exc_type="RuntimeError", key="injected failure on relu",
                 text="RuntimeError: injected failure on relu")
COS = Signature(kind="compile_error", exc_type="RuntimeError", key="injected failure on cos",
                text="RuntimeError: injected failure on cos")
ORIGINAL = ["relu", "cos", "sin"]


class ListProgram:
    """A representation whose programs are lists of op names."""

    def count_ops(self, program: list[str]) -> int:
        return len(program)

    def empty(self, program: list[str]) -> list[str]:
        return []

    def to_wire(self, program: list[str]) -> list[str]:
        return program


class FakePool:
    def __init__(self, reuse: bool, answer: Outcome) -> None:
        self.reuse = reuse
        self.answer = answer
        self.fresh: list[Any] = []

    def submit(self, wire: Any, timeout_s: float, fresh: bool = False) -> Future[Outcome]:
        self.fresh.append((wire, fresh))
        future: Future[Outcome] = Future()
        future.set_result(self.answer)
        return future

    def cancel(self, future: Future[Outcome]) -> None:
        future.cancel()


class FakeEvaluator:
    """Runs nothing: every run's future waits for the test to settle it."""

    def __init__(self, pool: FakePool | None = None) -> None:
        self.runs: list[tuple[Any, dict[str, Any], Future[Outcome]]] = []
        self.spared: set[Future[Outcome]] = set()
        self.on_outcome: Any = None
        self.timeouts: list[float] = []
        self.cancelled: list[Future[Outcome]] = []
        self.pool = pool or FakePool(reuse=False, answer=Passes())

    def submit(self, graph: Any, **options: Any) -> Future[Outcome]:
        future: Future[Outcome] = Future()
        self.runs.append((graph, options, future))
        return future

    def set_timeout(self, timeout_s: float) -> None:
        self.timeouts.append(timeout_s)

    def cancel(self, future: Future[Outcome]) -> None:
        self.cancelled.append(future)
        future.cancel()

    def live_pool(self) -> FakePool:
        return self.pool

    @property
    def original(self) -> Future[Outcome]:
        return self.runs[0][2]

    @property
    def empty(self) -> Future[Outcome]:
        return self.runs[1][2]


class FakeScheduler:
    def __init__(self) -> None:
        self.remembered: list[tuple[Any, Outcome]] = []
        self.forgotten = 0

    def remember(self, graph: Any, outcome: Outcome) -> None:
        self.remembered.append((graph, outcome))

    def forget(self, which: Any) -> None:
        self.forgotten += 1


class Job:
    """One job's OriginalRun with what it tells the engine recorded."""

    def __init__(self, remaining_s: float = 3600.0, pool: FakePool | None = None, **spec: Any) -> None:
        self.said: list[tuple[Milestone, str]] = []
        self.reduce_phases = 0
        self.facts = RunFacts(spec=JobSpec.model_validate(spec), program=ListProgram(),  # type: ignore[arg-type]
                              torch_version="2.13.0", nodes_original=len(ORIGINAL))
        self.original = OriginalRun(self.facts.spec, self.facts, HangCalibration(),
                                    say=lambda milestone, message: self.said.append((milestone, message)),
                                    remaining=lambda: remaining_s, stop_reason=lambda: None,
                                    reduce_phase=self._reduce_phase)
        self.evaluator = FakeEvaluator(pool)
        self.scheduler = FakeScheduler()

    def _reduce_phase(self) -> None:
        self.reduce_phases += 1

    def start(self) -> Job:
        self.original.start(self.evaluator, self.scheduler, ORIGINAL)  # type: ignore[arg-type]
        return self

    def milestones(self) -> list[Milestone]:
        return [milestone for milestone, _ in self.said]


def test_a_run_of_the_original_may_take_the_specs_bound_else_minutes_never_more_than_the_job_has_left() -> None:
    assert Job().original.original_timeout() == DEFAULT_ORIGINAL_TIMEOUT_S
    assert Job(limits={"original_timeout_s": 30}).original.original_timeout() == 30
    assert Job(failure={"kind": "timeout"}).original.original_timeout() == DEFAULT_TIMEOUT_FAILURE_S
    assert Job(failure={"kind": "timeout"}, limits={"candidate_timeout_s": 7}).original.original_timeout() == 7
    assert Job(remaining_s=12.0).original.original_timeout() == 12.0


def test_a_candidate_may_take_the_specs_timeout_else_the_originals_before_calibration() -> None:
    assert Job(limits={"candidate_timeout_s": 9}).original.first_timeout() == 9
    assert Job(limits={"original_timeout_s": 30}).original.first_timeout() == 30


def test_the_original_runs_several_times_in_one_child_beside_the_empty_program() -> None:
    job = Job(limits={"original_timeout_s": 30}).start()

    (graph, options, original), (empty, empty_options, _) = job.evaluator.runs
    assert graph == ORIGINAL and options == {"timeout_s": 30, "runs": ORIGINAL_RUNS, "output": True}
    assert empty == [] and empty_options == {"timeout_s": 30}
    assert original in job.evaluator.spared  # a short hang timeout never cuts the original short
    assert job.milestones() == [Milestone.original_started]


def test_while_the_original_runs_candidates_are_judged_against_the_first_failure_without_waiting() -> None:
    job = Job().start()

    assert job.original.still_fails(Fails(RELU)) is True
    assert job.original.still_fails(Fails(COS)) is False
    assert not job.evaluator.original.done()


def test_an_original_that_fails_so_is_the_target_and_calibrates_the_candidates_timeout() -> None:
    job = Job().start()
    job.original.still_fails(Fails(RELU))
    job.evaluator.original.set_result(Fails(RELU, duration_s=10.0, runs=ORIGINAL_RUNS, failed_runs=ORIGINAL_RUNS))
    job.evaluator.empty.set_result(Passes())

    assert job.original.settle() is None  # nothing ends or restarts the reduction

    assert job.facts.signature == RELU and job.facts.original_state is OriginalState.confirmed
    assert (job.facts.original_runs, job.facts.original_failures, job.facts.flaky) == (3, 3, False)
    assert job.facts.candidate_timeout_s == TIMEOUT_FACTOR * 10.0 and job.evaluator.timeouts == [40.0]
    assert job.scheduler.remembered == [(ORIGINAL, Fails(RELU))]
    assert job.reduce_phases == 1 and job.milestones()[-1] is Milestone.reproduced
    assert job.original.still_fails(Fails(RELU)) and not job.original.still_fails(Fails(COS))


def test_the_calibrated_timeout_has_a_floor_and_never_exceeds_the_specs() -> None:
    fast = Job().start()
    fast.evaluator.original.set_result(Fails(RELU, duration_s=0.1))
    fast.evaluator.empty.set_result(Passes())
    bounded = Job(limits={"candidate_timeout_s": 15}).start()
    bounded.evaluator.original.set_result(Fails(RELU, duration_s=60.0))
    bounded.evaluator.empty.set_result(Passes())

    fast.original.settle()
    bounded.original.settle()

    assert fast.facts.candidate_timeout_s == MIN_CANDIDATE_TIMEOUT_S
    assert bounded.facts.candidate_timeout_s == 15


def test_an_original_that_fails_in_some_runs_only_is_told_flaky() -> None:
    job = Job().start()
    job.evaluator.original.set_result(Fails(RELU, runs=3, failed_runs=2))
    job.evaluator.empty.set_result(Passes())

    job.original.settle()

    assert job.facts.flaky and Milestone.flaky in job.milestones()


def test_a_guess_the_original_contradicts_restarts_the_reduction() -> None:
    job = Job().start()
    job.original.still_fails(Fails(COS))
    job.evaluator.original.set_result(Fails(RELU))
    job.evaluator.empty.set_result(Passes())

    ending = job.original.settle()

    assert isinstance(ending, Restart) and job.facts.signature == RELU
    assert job.original.poll() is not None  # the scheduler's next poll stops the reduction


def test_an_original_that_passes_ends_the_job_not_reproducible_with_what_to_try() -> None:
    job = Job().start()
    job.evaluator.original.set_result(Passes(runs=3))

    ending = job.original.settle()

    assert isinstance(ending, Unreproduced) and ending.status is JobState.not_reproducible
    assert job.facts.original_state is OriginalState.not_reproduced
    assert job.facts.original_verdict == ending.reason and job.facts.next_step
    assert job.original.still_fails(Fails(RELU)) is False  # no candidate counts any more
    assert "the original's verdict came" in (job.original.poll() or "")


def test_a_result_may_go_out_before_the_verdict_only_when_a_candidate_showed_the_given_failure() -> None:
    guessing = Job().start()
    guessing.original.still_fails(Fails(RELU))
    given = Job(failure={"signature": str(RELU)}).start()
    given.original.still_fails(Fails(RELU))

    assert not guessing.original.defers_verdict(["relu"])  # a guess proves nothing
    assert given.original.defers_verdict(["relu"])
    assert not given.original.defers_verdict(ORIGINAL)  # the original itself is no smaller result
    given.evaluator.original.set_result(Fails(RELU))
    assert not given.original.defers_verdict(["relu"])  # the verdict is in: nothing to defer


def test_a_verdict_that_contradicts_a_candidates_proof_keeps_the_reduction_going() -> None:
    job = Job(failure={"signature": str(RELU)}).start()
    job.original.still_fails(Fails(RELU))
    job.evaluator.original.set_result(Passes(runs=3))

    assert job.original.settle() is None

    assert job.original.contradiction is not None and job.original.poll() is None  # the reduction goes on
    assert job.facts.original_state is OriginalState.not_reproduced
    assert job.original.still_fails(Fails(RELU))  # judged by the failure a candidate showed
    assert Milestone.original_not_reproduced in job.milestones()


def test_cancel_stops_the_originals_runs_that_still_go() -> None:
    job = Job().start()
    job.evaluator.empty.set_result(Passes())

    job.original.cancel()

    assert job.evaluator.cancelled == [job.evaluator.original]


def test_a_result_is_run_again_in_a_fresh_child_only_where_children_are_reused() -> None:
    for reuse, answer, doubt in ((False, Passes(), False), (True, Fails(RELU), False), (True, Passes(), True)):
        job = Job(pool=FakePool(reuse=reuse, answer=answer)).start()
        job.facts.best, job.facts.signature = ["relu"], RELU

        reason = job.original.verify_in_a_fresh_child()

        assert (reason is not None) is doubt
        assert job.evaluator.pool.fresh == ([(["relu"], True)] if reuse else [])


def test_a_hangs_result_the_time_ran_out_on_before_its_hold_says_what_judged_it() -> None:
    """pytorch#148073: a result judged a hang by the candidates' calibrated timeout, delivered when
    the job's time ran out before `_hold_hang_to_bound`, may be slow rather than hung: the report's
    reason says by what it was judged (`unheld_hang`), whatever time is left (none, at the deadline)."""
    job = Job(remaining_s=0.0, failure={"kind": "timeout"}, limits={"original_timeout_s": 60}).start()
    job.facts.signature, job.facts.best, job.facts.candidate_timeout_s = TIMEOUT_SIGNATURE, ["relu"], 9.0

    note = job.original.unheld_hang()

    assert note is not None and "calibrated timeout (9 s)" in note and "original's 60 s bound" in note
    job.facts.best = job.original.graph  # the original itself hung at its bound
    assert job.original.unheld_hang() is None
    job.facts.best = ["relu"]
    job.facts.candidate_timeout_s = 60.0  # judged by the original's bound already
    assert job.original.unheld_hang() is None
    judged_by_the_user = Job(failure={"kind": "timeout"}, limits={"candidate_timeout_s": 9}).start()
    judged_by_the_user.facts.signature, judged_by_the_user.facts.best = TIMEOUT_SIGNATURE, ["relu"]
    judged_by_the_user.facts.candidate_timeout_s = 9.0
    assert judged_by_the_user.original.unheld_hang() is None
    for other in (RELU, None):
        job.facts.signature, job.facts.candidate_timeout_s = other, 9.0
        assert job.original.unheld_hang() is None


def test_a_result_the_time_cut_short_carries_the_caveat_and_a_cancel_does_not() -> None:
    cancel = threading.Event()
    budget = Budget(JobSpec(backend="inductor"), time.monotonic(), cancel)

    ending = budget.when_stopped("job timeout of 60s reached", caveat="it may be slow rather than hung")

    assert ending.status is JobState.succeeded and ending.cut_short
    assert ending.reason == ("job timeout of 60s reached: the result is the smallest failing program found so far; "
                             "it may be slow rather than hung")
    assert budget.when_stopped("job timeout of 60s reached").reason.endswith("found so far")
    cancel.set()
    assert budget.when_stopped("cancelled", caveat="it may be slow rather than hung").reason == "cancelled"
