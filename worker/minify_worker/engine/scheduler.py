"""The reducer loop: drive strategies to a fixed point, testing candidates several at a time.

Strategies propose candidates in the order they prefer them; the scheduler tests up to
`parallelism` of them at once and accepts the first one *in that order* that still fails, so the
result does not depend on how many candidates ran in parallel or which finished first. Once a
candidate is known to fail, nothing after it is started and what is already running after it is
cancelled (its answer cannot change the choice). Every distinct candidate is tested at most once:
outcomes are memoized by the graph's structural hash. Slots beyond the one the earliest
candidate needs go to the read-ahead candidates most likely to fail (see `Scheduler`): a failure
known early makes the rest of the batch moot sooner.

The scheduler knows nothing about processes: it talks to an `Evaluator` (the sandbox in
production, a thread pool over a pure-Python oracle in tests) and reports through `Stats`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any, Protocol

from minify_worker.outcomes import Fails, Outcome, Passes, Stopped
from minify_worker.programs import Representation, representation
from minify_worker.programs.candidates import Candidate, StrategyContext, Tier

log = logging.getLogger(__name__)


class Evaluator(Protocol):
    """Runs one candidate program somewhere and answers with its outcome."""

    def submit(self, graph: Any) -> Future[Outcome]: ...

    def cancel(self, future: Future[Outcome]) -> None: ...



@dataclass
class Stats:
    checks_total: int = 0
    checks_cached: int = 0
    checks_in_flight: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    strategy: str = ""  # the strategy proposing candidates now (a progress event's phase while reducing)


@dataclass
class _Pending:
    candidate: Candidate
    key: str
    dropped_kinds: frozenset[str] = frozenset()
    future: Future[Outcome] | None = None
    outcome: Outcome | None = None

    @property
    def done(self) -> bool:
        return self.outcome is not None

    @property
    def queued(self) -> bool:
        return self.future is None and self.outcome is None


LOOKAHEAD_PER_SLOT = 4
"""How many candidates past the ones in flight the scheduler reads ahead, per parallel slot, to
choose which to start: a candidate costs a graph copy when read, nothing more until it starts."""


class Scheduler:
    """Tests candidates through an evaluator: in parallel, memoized, first-in-order wins.

    Which candidate a free slot goes to: the earliest one not started, when nothing before it is
    in flight (its answer is always needed); otherwise the one of the read-ahead most likely to
    fail, since a failure makes every candidate after it moot. Likelihood is learned from the
    outcomes so far: a candidate that drops an op kind whose absence made candidates pass is
    unlikely to fail; one that drops only kinds some failing candidate did without is likely
    to. This decides only the order work starts in: the candidate accepted is always the first
    failing one in the strategy's order.
    """

    def __init__(
        self,
        evaluator: Evaluator,
        still_fails: Callable[[Outcome], bool],
        *,
        parallelism: int,
        on_check: Callable[[], None] | None = None,
        should_stop: Callable[[], str | None] | None = None,
        program: Representation | None = None,
    ) -> None:
        self._evaluator = evaluator
        self.program = program or representation("fx")
        self._still_fails = still_fails
        self._parallelism = max(1, parallelism)
        self._on_check = on_check or (lambda: None)
        self._should_stop = should_stop or (lambda: None)
        self._memo: dict[str, Outcome] = {}
        self._running: dict[str, Future[Outcome]] = {}
        self._passes_without: Counter[str] = Counter()  # kind -> candidates that passed without it
        self._not_needed: set[str] = set()  # kinds some still-failing candidate did without
        self.stats = Stats()

    @property
    def parallelism(self) -> int:
        return self._parallelism

    def remember(self, graph: Any, outcome: Outcome) -> None:
        """Seed the memo, e.g. with the original program's outcome."""
        self._memo[self.program.key(graph)] = outcome

    def forget(self, judged: Callable[[Outcome], bool]) -> None:
        """Drop the memoized outcomes `judged` picks: those candidates run again when asked (e.g.
        hangs decided by a timeout that turned out too short)."""
        for key in [key for key, outcome in self._memo.items() if judged(outcome)]:
            del self._memo[key]

    def first_failing(self, current: Any, candidates: Iterable[Candidate], *,
                      size: Callable[[Any], tuple[int, ...]] | None = None) -> Candidate | None:
        """The first candidate, in the given order, that is smaller than `current` (by `size`:
        the representation's, op count first, unless a phase measures otherwise) and still fails."""
        size = size or self.program.size
        source = iter(candidates)
        current_size = size(current)
        current_key = self.program.key(current)
        current_kinds = self.program.op_kinds(current)
        lookahead = LOOKAHEAD_PER_SLOT * self._parallelism
        window: list[_Pending] = []
        exhausted = False
        try:
            while True:
                self._drop_after_first_failure(window)
                while window and window[0].done:
                    head = window.pop(0)
                    assert head.outcome is not None
                    if self._still_fails(head.outcome):
                        return head.candidate
                failure_known = any(p.done and self._still_fails(p.outcome) for p in window)
                queued = sum(1 for p in window if p.queued)
                if not failure_known and not exhausted and queued < lookahead:
                    candidate = next(source, None)
                    if candidate is None:
                        exhausted = True
                    else:
                        pending = self._read(candidate, size(candidate.graph) < current_size, current_key,
                                             current_kinds)
                        if pending is not None:
                            window.append(pending)
                    continue
                while self._in_flight(window) < self._parallelism:
                    chosen = self._next_to_start(window)
                    if chosen is None:
                        break
                    self._start(chosen)
                if not window:
                    return None
                if self._in_flight(window) == 0:
                    continue  # what started was answered from the memo
                self._wait_any(window)
        finally:
            for pending in window:
                if not pending.done and pending.future is not None:
                    self._release(pending)

    def _read(self, candidate: Candidate, smaller: bool, current_key: str,
              current_kinds: frozenset[str]) -> _Pending | None:
        """A pending entry for the candidate (answered at once from the memo), or None if moot."""
        if not smaller:
            return None
        key = self.program.key(candidate.graph)
        if key == current_key:
            return None
        pending = _Pending(candidate, key, current_kinds - self.program.op_kinds(candidate.graph))
        if key in self._memo:
            self.stats.checks_total += 1
            self.stats.checks_cached += 1
            pending.outcome = self._memo[key]
            self._on_check()
        return pending

    def _next_to_start(self, window: list[_Pending]) -> _Pending | None:
        for pending in window:
            if pending.queued:
                return pending
            if not pending.done:
                break  # something earlier is in flight: this slot may speculate
        queued = [p for p in window if p.queued]
        return max(queued, key=self._likelihood, default=None)  # max keeps the earliest of equals

    def _likelihood(self, pending: _Pending) -> int:
        return -sum(self._passes_without[kind] for kind in pending.dropped_kinds if kind not in self._not_needed)

    def _start(self, pending: _Pending) -> None:
        self.stats.checks_total += 1
        if pending.key in self._memo:
            self.stats.checks_cached += 1
            pending.outcome = self._memo[pending.key]
            self._on_check()
            return
        future = self._running.get(pending.key)
        if future is None:
            future = self._evaluator.submit(pending.candidate.graph)
            self._running[pending.key] = future
            self.stats.checks_in_flight += 1
        else:
            self.stats.checks_cached += 1
        pending.future = future

    def _in_flight(self, window: Sequence[_Pending]) -> int:
        return sum(1 for p in window if p.future is not None and not p.done)

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
            self._learn(pending, outcome)
            log.debug("%s -> %s", pending.candidate.description, outcome)
        self._on_check()

    def _learn(self, pending: _Pending, outcome: Outcome) -> None:
        if self._still_fails(outcome):
            self._not_needed.update(pending.dropped_kinds)
        elif isinstance(outcome, Passes):
            self._passes_without.update(pending.dropped_kinds)

    def _outcome_label(self, outcome: Outcome) -> str:
        if isinstance(outcome, Fails) and not self._still_fails(outcome):
            return "other_failure"
        return outcome.kind

    def _drop_after_first_failure(self, window: list[_Pending]) -> None:
        """Once a candidate is known to fail, the ones after it are moot: cancel, forget them."""
        first = next((i for i, p in enumerate(window) if p.done and self._still_fails(p.outcome)), None)
        if first is None:
            return
        for pending in window[first + 1 :]:
            if not pending.done and pending.future is not None:
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
    graph: Any
    accepted: list[str]


def reduce(
    scheduler: Scheduler,
    graph: Any,
    context: StrategyContext,
    passes: Sequence[Tier],
    *,
    on_accept: Callable[[Any, str], None] | None = None,
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
            scheduler.stats.strategy = name
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
