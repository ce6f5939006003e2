"""The scheduler: first-in-order wins at any parallelism, memo, cancellation, stopping.

The evaluator here is a thread pool over a pure-Python oracle (tests/support/evaluators.py): the
scheduler is under test, not the sandbox (tests/worker/sandbox/test_sandbox*.py and
tests/worker/engine/test_engine*.py run real children).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import torch.fx as fx

from minify_worker.engine.scheduler import Scheduler, reduce
from minify_worker.outcomes import Stopped
from minify_worker.programs.candidates import Candidate, StrategyContext, Tier
from minify_worker.programs.fx import graph as g
from minify_worker.programs.fx.moves import PASSES
from tests.support.evaluators import ThreadEvaluator, still_fails
from tests.support.graphs import flat_chain, ops_of

pytestmark = pytest.mark.fast


def contains_relu(graph: fx.Graph) -> bool:
    return "relu" in ops_of(graph)


def truncations(graph: fx.Graph) -> list[Candidate]:
    names = [node.name for node in graph.nodes if node.op == "call_function"]
    return [Candidate(g.truncate_after(graph, name), f"truncate after {name}") for name in names]


@pytest.mark.parametrize("parallelism", [1, 2, 4, 8])
def test_first_failing_candidate_in_order_wins_at_any_parallelism(parallelism: int) -> None:
    graph = flat_chain(("sin", "cos", "relu", "exp", "tanh", "neg"))
    # Later candidates answer first: a scheduler that took the first answer would pick a longer prefix.
    evaluator = ThreadEvaluator(contains_relu, delay=lambda cand: 0.02 * (10 - g.count_ops(cand)))
    scheduler = Scheduler(evaluator, still_fails, parallelism=parallelism)

    chosen = scheduler.first_failing(graph, truncations(graph))

    assert chosen is not None
    assert chosen.description == "truncate after relu"


def test_parallelism_bounds_candidates_in_flight() -> None:
    graph = flat_chain(("sin", "cos", "exp", "tanh", "neg", "abs", "relu"))
    evaluator = ThreadEvaluator(contains_relu, delay=lambda _: 0.05)
    scheduler = Scheduler(evaluator, still_fails, parallelism=3)

    scheduler.first_failing(graph, truncations(graph))

    assert 2 <= evaluator.max_in_flight <= 3


def test_a_candidate_seen_before_is_answered_from_the_memo() -> None:
    graph = flat_chain(("sin", "relu", "cos"))
    evaluator = ThreadEvaluator(lambda _: False)
    scheduler = Scheduler(evaluator, still_fails, parallelism=2)

    scheduler.first_failing(graph, truncations(graph))
    submitted = len(evaluator.submitted)
    scheduler.first_failing(graph, truncations(graph))

    assert len(evaluator.submitted) == submitted
    assert scheduler.stats.checks_cached == submitted


def test_renamed_candidates_share_a_memo_entry() -> None:
    graph = flat_chain(("sin", "relu", "cos"))
    renamed = g.copy_graph(graph)
    for node in renamed.nodes:
        if node.op == "call_function":
            node.name = f"renamed_{node.name}"
    evaluator = ThreadEvaluator(lambda _: False)
    scheduler = Scheduler(evaluator, still_fails, parallelism=1)

    scheduler.first_failing(graph, truncations(graph))
    scheduler.first_failing(renamed, truncations(renamed))

    assert scheduler.stats.checks_cached == len(evaluator.submitted)


def test_work_after_a_known_failure_is_cancelled() -> None:
    graph = flat_chain(("relu", "sin", "cos", "exp", "tanh", "neg"))
    # The first candidate (relu alone) fails fast; the others are slow and become moot.
    evaluator = ThreadEvaluator(contains_relu, delay=lambda cand: 0.0 if g.count_ops(cand) == 1 else 0.5)
    scheduler = Scheduler(evaluator, still_fails, parallelism=4)

    chosen = scheduler.first_failing(graph, truncations(graph))

    assert chosen is not None and chosen.description == "truncate after relu"
    assert len(evaluator.cancelled) == 3
    assert scheduler.stats.outcomes["cancelled"] == 3
    assert scheduler.stats.checks_in_flight == 0


def test_candidates_no_smaller_than_the_current_graph_are_not_tested() -> None:
    graph = flat_chain(("sin", "relu"))
    evaluator = ThreadEvaluator(contains_relu)
    scheduler = Scheduler(evaluator, still_fails, parallelism=2)

    chosen = scheduler.first_failing(graph, [Candidate(g.copy_graph(graph), "the same graph")])

    assert chosen is None
    assert evaluator.submitted == []


def test_a_stop_request_interrupts_waiting() -> None:
    graph = flat_chain(("sin", "relu", "cos"))
    evaluator = ThreadEvaluator(contains_relu, delay=lambda _: 5.0)
    stop = threading.Event()
    scheduler = Scheduler(evaluator, still_fails, parallelism=2,
                          should_stop=lambda: "cancelled" if stop.is_set() else None)
    threading.Timer(0.2, stop.set).start()

    started = time.monotonic()
    with pytest.raises(Stopped, match="cancelled"):
        scheduler.first_failing(graph, truncations(graph))

    assert time.monotonic() - started < 2
    assert len(evaluator.cancelled) == 2


def test_reduce_reaches_the_single_failing_op_of_a_chain() -> None:
    graph = flat_chain(("sin", "cos", "exp", "relu", "tanh", "neg", "abs", "sigmoid"))
    evaluator = ThreadEvaluator(contains_relu)
    scheduler = Scheduler(evaluator, still_fails, parallelism=4)

    reduction = reduce(scheduler, graph, StrategyContext(), PASSES)

    assert ops_of(reduction.graph) == ["relu"]


def _extracted(graph: fx.Graph, *ops: str) -> Candidate:
    extracted = g.extract(graph, ops)
    assert extracted is not None
    return Candidate(extracted, "+".join(ops))


def _scheduler_that_learned_relu_matters(evaluator: ThreadEvaluator, graph: fx.Graph) -> Scheduler:
    """Three candidates without relu (and with tanh and neg) have passed."""
    scheduler = Scheduler(evaluator, still_fails, parallelism=2)
    learning = [_extracted(graph, op, "tanh", "neg") for op in ("sin", "cos", "exp")]
    assert scheduler.first_failing(graph, learning) is None
    evaluator.submitted.clear()
    return scheduler


def test_a_spare_slot_goes_to_the_candidate_most_likely_to_fail() -> None:
    graph = flat_chain(("sin", "cos", "exp", "relu", "tanh", "neg"))
    evaluator = ThreadEvaluator(contains_relu, delay=lambda _: 0.05)
    scheduler = _scheduler_that_learned_relu_matters(evaluator, graph)
    candidates = [_extracted(graph, *ops) for ops in
                  (("sin", "cos"), ("cos", "exp"), ("sin", "exp"), ("sin", "cos", "exp", "relu"), ("tanh", "neg"))]

    chosen = scheduler.first_failing(graph, candidates)

    assert chosen is not None and chosen.description == "sin+cos+exp+relu"
    started = [ops_of(submitted) for submitted in evaluator.submitted]
    assert started[:2] == [["sin", "cos"], ["sin", "cos", "exp", "relu"]]
    assert ["tanh", "neg"] not in started  # after the failure: never started


def test_an_earlier_failing_candidate_wins_over_a_likelier_one_that_failed_first() -> None:
    graph = flat_chain(("sin", "cos", "exp", "relu", "tanh", "neg"))
    evaluator = ThreadEvaluator(contains_relu, delay=lambda cand: 0.01 if g.count_ops(cand) == 4 else 0.1)
    scheduler = _scheduler_that_learned_relu_matters(evaluator, graph)
    candidates = [_extracted(graph, *ops) for ops in
                  (("sin", "cos"), ("cos", "relu"), ("sin", "exp"), ("sin", "cos", "exp", "relu"), ("tanh", "neg"))]

    chosen = scheduler.first_failing(graph, candidates)

    assert chosen is not None and chosen.description == "cos+relu"
    assert scheduler.stats.checks_in_flight == 0


def test_reduce_runs_the_opening_tier_once_and_tells_strategies_the_parallelism() -> None:
    graph = flat_chain(("sin", "cos", "exp", "relu", "tanh", "neg", "abs", "sigmoid"))
    seen: list[int] = []

    def spy(current: fx.Graph, context: StrategyContext) -> Iterator[Candidate]:
        seen.append(context.parallelism)
        return iter(())

    evaluator = ThreadEvaluator(lambda cand: {"sin", "neg"} <= set(ops_of(cand)))
    scheduler = Scheduler(evaluator, still_fails, parallelism=3)

    reduction = reduce(scheduler, graph, StrategyContext(), [Tier.of([spy], opening=True), *PASSES[1:]])

    assert seen == [3]
    assert sorted(ops_of(reduction.graph)) == ["neg", "sin"]
