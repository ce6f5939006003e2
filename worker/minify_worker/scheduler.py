"""The reducer loop: drive strategies to a fixed point, testing candidates several at a time.

Strategies propose candidates in the order they prefer them; the scheduler tests up to
`parallelism` of them at once and accepts the first one *in that order* that still fails, so the
result does not depend on how many candidates ran in parallel or which finished first. Once a
candidate is known to fail, nothing after it is started and what is already running after it is
cancelled (its answer cannot change the choice). Every distinct candidate is tested at most once:
outcomes are memoized by the graph's structural hash.

The scheduler knows nothing about processes: it talks to an `Evaluator` (the sandbox in
production, a thread pool over a pure-Python oracle in tests) and reports through `Stats`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Protocol

import torch.fx as fx

from minify_worker.graph import size_key, structural_hash
from minify_worker.outcomes import Fails, Outcome
from minify_worker.strategies import Candidate, StrategyContext, Tier

log = logging.getLogger(__name__)


class Evaluator(Protocol):
    """Runs one candidate graph somewhere and answers with its outcome."""

    def submit(self, graph: fx.Graph) -> Future[Outcome]: ...

    def cancel(self, future: Future[Outcome]) -> None: ...


Strategy = Callable[[fx.Graph, StrategyContext], Iterator[Candidate]]


class Stopped(Exception):
    """The job was cancelled or ran out of time; the best graph so far is still valid."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class Stats:
    checks_total: int = 0
    checks_cached: int = 0
    checks_in_flight: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    phase: str = ""


@dataclass
class _Pending:
    candidate: Candidate
    key: str
    future: Future[Outcome] | None = None
    outcome: Outcome | None = None

    @property
    def done(self) -> bool:
        return self.outcome is not None


class Scheduler:
    """Tests candidates through an evaluator: in parallel, memoized, first-in-order wins."""

    def __init__(
        self,
        evaluator: Evaluator,
        still_fails: Callable[[Outcome], bool],
        *,
        parallelism: int,
        on_check: Callable[[], None] | None = None,
        should_stop: Callable[[], str | None] | None = None,
    ) -> None:
        self._evaluator = evaluator
        self._still_fails = still_fails
        self._parallelism = max(1, parallelism)
        self._on_check = on_check or (lambda: None)
        self._should_stop = should_stop or (lambda: None)
        self._memo: dict[str, Outcome] = {}
        self._running: dict[str, Future[Outcome]] = {}
        self.stats = Stats()

    @property
    def parallelism(self) -> int:
        return self._parallelism

    def remember(self, graph: fx.Graph, outcome: Outcome) -> None:
        """Seed the memo, e.g. with the original program's outcome."""
        self._memo[structural_hash(graph)] = outcome

    def first_failing(self, current: fx.Graph, candidates: Iterable[Candidate]) -> Candidate | None:
        """The first candidate, in the given order, that is smaller than `current` and still fails."""
        source = iter(candidates)
        current_size = size_key(current)
        current_key = structural_hash(current)
        window: list[_Pending] = []
        exhausted = False
        feeding = True
        try:
            while True:
                while feeding and not exhausted and self._in_flight(window) < self._parallelism:
                    candidate = next(source, None)
                    if candidate is None:
                        exhausted = True
                        break
                    pending = self._start(candidate, current_key, current_size)
                    if pending is None:
                        continue
                    window.append(pending)
                    if pending.done and self._still_fails(pending.outcome):
                        feeding = False
                while window and window[0].done:
                    head = window.pop(0)
                    assert head.outcome is not None
                    if self._still_fails(head.outcome):
                        return head.candidate
                if not window:
                    if exhausted or not feeding:
                        return None
                    continue
                self._wait_any(window)
                if any(p.done and self._still_fails(p.outcome) for p in window):
                    feeding = False
                    self._cancel_after_first_failure(window)
        finally:
            for pending in window:
                if not pending.done and pending.future is not None:
                    self._release(pending)

    def _start(self, candidate: Candidate, current_key: str, current_size: tuple[int, ...]) -> _Pending | None:
        if size_key(candidate.graph) >= current_size:
            return None
        key = structural_hash(candidate.graph)
        if key == current_key:
            return None
        self.stats.checks_total += 1
        if key in self._memo:
            self.stats.checks_cached += 1
            self._on_check()
            return _Pending(candidate, key, outcome=self._memo[key])
        future = self._running.get(key)
        if future is None:
            future = self._evaluator.submit(candidate.graph)
            self._running[key] = future
            self.stats.checks_in_flight += 1
        else:
            self.stats.checks_cached += 1
        return _Pending(candidate, key, future=future)

    def _in_flight(self, window: Sequence[_Pending]) -> int:
        return sum(1 for p in window if not p.done)

    def _wait_any(self, window: list[_Pending]) -> None:
        running = {p.future for p in window if not p.done and p.future is not None}
        while running:
            reason = self._should_stop()
            if reason:
                raise Stopped(reason)
            done, _ = wait(running, timeout=0.25, return_when=FIRST_COMPLETED)
            if done:
                break
        for pending in window:
            if not pending.done and pending.future is not None and pending.future.done():
                self._finish(pending)

    def _finish(self, pending: _Pending) -> None:
        assert pending.future is not None
        outcome = pending.future.result()
        pending.outcome = outcome
        if pending.key in self._running:
            del self._running[pending.key]
            self.stats.checks_in_flight -= 1
            self._memo[pending.key] = outcome
            self.stats.outcomes[self._outcome_label(outcome)] += 1
            log.debug("%s -> %s", pending.candidate.description, outcome)
        self._on_check()

    def _outcome_label(self, outcome: Outcome) -> str:
        if isinstance(outcome, Fails) and not self._still_fails(outcome):
            return "other_failure"
        return outcome.kind

    def _cancel_after_first_failure(self, window: list[_Pending]) -> None:
        first = next(i for i, p in enumerate(window) if p.done and self._still_fails(p.outcome))
        for pending in window[first + 1 :]:
            if not pending.done:
                self._release(pending)
        del window[first + 1 :]

    def _release(self, pending: _Pending) -> None:
        """Give up on a running candidate nobody needs any more."""
        assert pending.future is not None
        if self._running.get(pending.key) is pending.future:
            del self._running[pending.key]
            self.stats.checks_in_flight -= 1
            if pending.future.done():
                self._memo[pending.key] = pending.future.result()
            else:
                # It still counts as a check (it ran), so checks_total never goes down.
                self._evaluator.cancel(pending.future)
                self.stats.outcomes["cancelled"] += 1


@dataclass
class Reduction:
    graph: fx.Graph
    accepted: list[str]


def reduce(
    scheduler: Scheduler,
    graph: fx.Graph,
    context: StrategyContext,
    passes: Sequence[Tier],
    *,
    on_accept: Callable[[fx.Graph, str], None] | None = None,
) -> Reduction:
    """Apply strategy tiers to a fixed point.

    Each tier runs to a fixed point (restarting from its first strategy after every success, as
    torch's minifier does), then the next tier gets a turn; a success in a later tier sends the
    loop back to the first tier that is not an opening (`Tier.opening`: those run once, first).
    The strategies learn the scheduler's parallelism through `context.parallelism`.
    """
    context = dataclasses.replace(context, parallelism=scheduler.parallelism)
    revisit = next((index for index, tier in enumerate(passes) if not tier.opening), 0)
    accepted: list[str] = []
    tier = 0
    while tier < len(passes):
        progressed = False
        for name, strategy in passes[tier].strategies:
            scheduler.stats.phase = name
            candidate = scheduler.first_failing(graph, strategy(graph, context))
            if candidate is not None:
                graph = candidate.graph
                accepted.append(candidate.description)
                if on_accept is not None:
                    on_accept(graph, candidate.description)
                progressed = True
                break
        if not progressed:
            tier += 1
        elif not passes[tier].opening:
            tier = revisit
    return Reduction(graph, accepted)
