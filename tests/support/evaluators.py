"""A fake evaluator for the scheduler's callers: a thread pool over a pure-Python oracle that
answers `Fails(SIGNATURE)` or `Passes()`, so a reduction runs without a sandbox."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch.fx as fx

from minify_worker.outcomes import Fails, Outcome, Passes, Signature

SIGNATURE = Signature("compile_error", "RuntimeError", "injected failure on relu")


class ThreadEvaluator:
    """Answers Fails when `oracle(graph)`, after `delay(graph)` seconds, on worker threads."""

    def __init__(self, oracle: Callable[[fx.Graph], bool], delay: Callable[[fx.Graph], float] = lambda _: 0.0,
                 workers: int = 8) -> None:
        self.oracle = oracle
        self.delay = delay
        self.pool = ThreadPoolExecutor(workers)
        self.submitted: list[fx.Graph] = []
        self.cancelled: list[Future[Outcome]] = []
        self.max_in_flight = 0
        self._in_flight = 0
        self._lock = threading.Lock()

    def submit(self, graph: fx.Graph) -> Future[Outcome]:
        self.submitted.append(graph)
        with self._lock:
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
        return self.pool.submit(self._run, graph)

    def _run(self, graph: fx.Graph) -> Outcome:
        try:
            time.sleep(self.delay(graph))
            return Fails(SIGNATURE) if self.oracle(graph) else Passes()
        finally:
            with self._lock:
                self._in_flight -= 1

    def cancel(self, future: Future[Outcome]) -> None:
        self.cancelled.append(future)


def still_fails(outcome: Outcome) -> bool:
    return isinstance(outcome, Fails) and outcome.signature.same_as(SIGNATURE)
