"""The scheduler's view of the sandbox (engine/evaluator.py): what a dead fork server and a faulted
child cost, and when the sandbox restarts, over fake pools whose children answer as the test says:
no child runs. A real fork server killed mid-job is in test_sandbox.py and test_engine_limits.py."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from minify_worker.engine import evaluator as evaluator_module
from minify_worker.engine.evaluator import MAX_SANDBOX_RESTARTS, SandboxEvaluator, in_sandbox
from minify_worker.outcomes import Fails, Invalid, Outcome, Passes, Signature
from minify_worker.sandbox import SandboxError, SandboxFault

pytestmark = pytest.mark.fast

RELU = Signature(kind="compile_error", exc_type="RuntimeError", key="injected failure on relu")
# What a pool says when a forked child cannot use CUDA (SandboxFault.fork_related), and when a
# child meets a fault a fresh sandbox would meet too.
FORK_FAULT = "CUDA cannot be used in a forked subprocess"
# A child that died before it ran its request: perhaps the fork's doing, perhaps not the next time.
DIED_FAULT = "the child died before it ran its request"
OTHER_FAULT = "torch cannot be imported in the child"


class WireProgram:
    """A representation whose wire form is the program itself."""

    def to_wire(self, program: Any) -> Any:
        return program


class FakePool:
    """A sandbox pool whose children never run: each request's future is kept for the test to settle."""

    def __init__(self, name: str, start: str | None = None) -> None:
        self.name = name
        self.start_method = start or "fork"
        self.reuse = False
        self.requests: list[tuple[Any, float | None, Future[Outcome]]] = []
        self.timeouts: list[tuple[Future[Outcome], float]] = []
        self.cancelled: list[Future[Outcome]] = []
        self.closed = False

    def submit(self, wire: Any, timeout_s: float | None = None, runs: int = 1, output: bool = False,
               fresh: bool = False) -> Future[Outcome]:
        future: Future[Outcome] = Future()
        self.requests.append((wire, timeout_s, future))
        return future

    def submit_outcome_call(self, target: str, kwargs: dict[str, Any], timeout_s: float,
                            purpose: str = "call") -> Future[Outcome]:
        return self.submit(target, timeout_s)

    def set_timeout(self, future: Future[Outcome], timeout_s: float) -> None:
        self.timeouts.append((future, timeout_s))

    def cancel(self, future: Future[Outcome]) -> None:
        self.cancelled.append(future)

    def close(self) -> None:
        self.closed = True

    def answer(self, index: int, outcome: Outcome) -> None:
        self.requests[index][2].set_result(outcome)

    def fail(self, index: int, error: BaseException) -> None:
        self.requests[index][2].set_exception(error)


class Restarts:
    """The evaluator's `restart`: a fresh FakePool each time, with the start method asked for."""

    def __init__(self) -> None:
        self.pools: list[FakePool] = []
        self.starts: list[str | None] = []

    def __call__(self, start: str | None) -> FakePool:
        self.starts.append(start)
        self.pools.append(FakePool(f"restart {len(self.pools) + 1}", start))
        return self.pools[-1]


def evaluator(timeout_s: float = 30.0) -> tuple[SandboxEvaluator, FakePool, Restarts]:
    first, restarts = FakePool("first"), Restarts()
    return SandboxEvaluator(first, timeout_s, restarts, WireProgram()), first, restarts  # type: ignore[arg-type]


def test_an_outcome_comes_back_as_the_child_gave_it_with_the_evaluators_timeout() -> None:
    scheduler_view, pool, _ = evaluator(timeout_s=12.0)

    future = scheduler_view.submit(["relu"])
    pool.answer(0, Fails(RELU))

    assert future.result(timeout=1) == Fails(RELU)
    assert pool.requests[0][:2] == (["relu"], 12.0)


def test_a_dead_fork_server_costs_the_candidates_in_flight_and_the_next_submit_restarts_it() -> None:
    scheduler_view, pool, restarts = evaluator()
    first, second = scheduler_view.submit(["relu"]), scheduler_view.submit(["cos"])

    pool.fail(0, SandboxError("the fork server died"))
    pool.fail(1, SandboxError("the fork server died"))

    assert isinstance(first.result(timeout=1), Invalid) and isinstance(second.result(timeout=1), Invalid)
    assert restarts.pools == []  # not before it is needed
    scheduler_view.submit(["sin"])
    assert restarts.starts == [None] and scheduler_view.restarts == 1  # forked again, as the first was
    assert restarts.pools[0].requests[0][0] == ["sin"]


def test_a_fork_server_that_keeps_dying_fails_the_job() -> None:
    scheduler_view, pool, restarts = evaluator()
    scheduler_view.submit(["relu"])
    pool.fail(0, SandboxError("the fork server died"))
    for _ in range(MAX_SANDBOX_RESTARTS):
        scheduler_view.submit(["relu"])
        restarts.pools[-1].fail(0, SandboxError("the fork server died"))

    with pytest.raises(SandboxError, match=f"died {MAX_SANDBOX_RESTARTS + 1} times"):
        scheduler_view.submit(["relu"])


def test_a_fork_related_fault_restarts_the_sandbox_spawned_and_runs_the_candidate_again() -> None:
    scheduler_view, pool, restarts = evaluator()
    replacements: list[FakePool] = []
    scheduler_view.on_restart = replacements.append  # type: ignore[assignment]
    future = scheduler_view.submit(["relu"])

    pool.fail(0, SandboxFault(FORK_FAULT))

    assert not future.done()  # a fault is never an outcome
    assert restarts.starts == ["spawn"] and restarts.pools[0].requests[0][0] == ["relu"]
    assert replacements == restarts.pools  # report.json's sandbox_start follows it
    restarts.pools[0].answer(0, Fails(RELU))
    assert future.result(timeout=1) == Fails(RELU)


def test_a_fault_a_fresh_sandbox_would_meet_too_fails_the_job_with_its_cause() -> None:
    scheduler_view, pool, restarts = evaluator()
    future = scheduler_view.submit(["relu"])

    pool.fail(0, SandboxFault(OTHER_FAULT))

    with pytest.raises(SandboxError, match=OTHER_FAULT):
        future.result(timeout=1)
    assert restarts.pools == []


def test_a_fork_related_fault_that_outlives_the_restarts_fails_the_job() -> None:
    scheduler_view, pool, restarts = evaluator()
    future = scheduler_view.submit(["relu"])

    pool.fail(0, SandboxFault(DIED_FAULT))
    for restart in range(MAX_SANDBOX_RESTARTS):
        restarts.pools[restart].fail(0, SandboxFault(DIED_FAULT))

    with pytest.raises(SandboxError, match=f"still after {MAX_SANDBOX_RESTARTS} sandbox restarts"):
        future.result(timeout=1)
    assert len(restarts.pools) == MAX_SANDBOX_RESTARTS
    assert restarts.starts == ["spawn"] * MAX_SANDBOX_RESTARTS


@pytest.mark.parametrize("first_start", ["fork", "spawn"])
def test_cuda_unusable_in_a_spawned_servers_children_is_not_tried_again(first_start: str) -> None:
    # A spawned server whose children meet CUDA initialized before their fork initialized it
    # itself: the next spawned server would do the same, so it is the job's end, not a restart.
    first, restarts = FakePool("first", first_start), Restarts()
    scheduler_view = SandboxEvaluator(first, 30.0, restarts, WireProgram())  # type: ignore[arg-type]
    future = scheduler_view.submit(["relu"])

    first.fail(0, SandboxFault(FORK_FAULT))
    if first_start == "fork":  # a forked server is replaced by a spawned one once
        assert restarts.starts == ["spawn"]
        restarts.pools[0].fail(0, SandboxFault(FORK_FAULT))

    with pytest.raises(SandboxError) as raised:
        future.result(timeout=1)
    assert len(restarts.pools) == (1 if first_start == "fork" else 0)
    assert str(raised.value).startswith(FORK_FAULT)
    if first_start == "fork":
        assert "a sandbox spawned afresh met it too, after 1 sandbox restart" in str(raised.value)
    else:
        assert str(raised.value) == FORK_FAULT


def test_every_candidate_outcome_is_seen_as_it_comes_but_not_a_calls() -> None:
    scheduler_view, pool, _ = evaluator()
    seen: list[tuple[Any, Outcome]] = []
    scheduler_view.on_outcome = lambda graph, outcome: seen.append((graph, outcome))

    scheduler_view.submit(["relu"])
    scheduler_view.submit_call("probe:run", {}, timeout_s=5.0)
    pool.answer(0, Passes())
    pool.answer(1, Fails(RELU))

    assert seen == [(["relu"], Passes())]


def test_a_new_timeout_reaches_the_candidates_in_flight_but_not_the_spared_runs() -> None:
    scheduler_view, pool, _ = evaluator()
    scheduler_view.submit(["relu"])
    original = scheduler_view.submit(["relu", "cos"])
    scheduler_view.spared.add(original)
    scheduler_view.submit_call("probe:run", {}, timeout_s=5.0)  # a call keeps its own timeout

    scheduler_view.set_timeout(3.0)

    assert pool.timeouts == [(pool.requests[0][2], 3.0)]
    scheduler_view.submit(["cos"])
    assert pool.requests[-1][1] == 3.0


def test_cancelling_a_run_cancels_its_child_too() -> None:
    scheduler_view, pool, _ = evaluator()
    future = scheduler_view.submit(["relu"])

    scheduler_view.cancel(future)

    assert future.cancelled() and pool.cancelled == [pool.requests[0][2]]


def test_close_closes_the_pools_it_restarted_not_the_callers() -> None:
    scheduler_view, pool, restarts = evaluator()
    scheduler_view.submit(["relu"])
    pool.fail(0, SandboxError("the fork server died"))
    scheduler_view.submit(["relu"])
    restarts.pools[0].fail(0, SandboxError("the fork server died"))
    scheduler_view.submit(["relu"])

    scheduler_view.close()

    assert [restarted.closed for restarted in restarts.pools] == [True, True] and not pool.closed


def test_in_sandbox_spawns_a_fresh_sandbox_when_the_forked_one_cannot_run(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    made: list[FakePool] = []

    def pool(workdir: Path, store: Any, spec: Any, parallelism: int, start: str | None = None) -> FakePool:
        made.append(FakePool(f"pool {len(made)}", start))
        return made[-1]

    def run(sandbox: FakePool) -> str:
        if sandbox.start_method == "fork":
            raise SandboxFault(FORK_FAULT)
        return "ran"

    monkeypatch.setattr(evaluator_module, "SandboxPool", pool)

    assert in_sandbox(tmp_path, None, 2, run) == "ran"  # type: ignore[arg-type]
    assert [p.start_method for p in made] == ["fork", "spawn"] and all(p.closed for p in made)


def test_in_sandbox_raises_a_fault_a_fresh_sandbox_would_not_help(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    made: list[FakePool] = []

    def pool(workdir: Path, store: Any, spec: Any, parallelism: int, start: str | None = None) -> FakePool:
        made.append(FakePool("pool", start))
        return made[-1]

    def run(sandbox: FakePool) -> str:
        raise SandboxFault(OTHER_FAULT)

    monkeypatch.setattr(evaluator_module, "SandboxPool", pool)

    with pytest.raises(SandboxFault, match=OTHER_FAULT):
        in_sandbox(tmp_path, None, 2, run)  # type: ignore[arg-type]
    assert len(made) == 1 and made[0].closed
