"""The culprit phase's probes, in the engine's process: what a probe compiles (`Key`), and
`Prober`, which runs them in sandbox children (`probe.probe_in_child`) through the job's
`SandboxEvaluator`, memoized, started ahead as slots free up, bounded by the phase's deadline."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minify_contract.models import JobSpec
from minify_worker import oracle
from minify_worker.outcomes import Outcome, Passes, Signature, Stopped
from minify_worker.programs.fx import bisector

if TYPE_CHECKING:
    from minify_worker.engine.evaluator import SandboxEvaluator

from minify_worker.programs.fx.culprit.workarounds import BACKEND

CALL_TARGET = "minify_worker.programs.fx.culprit.probe:probe_in_child"


class OutOfBudget(Exception):
    """The phase's budget ran out: the probes left are not run."""


@dataclass(frozen=True)
class Key:
    """What a probe compiles: the graph (minimal or original), the backend, config overrides, and
    the bisector's environment (empty unless a subsystem is being counted or disabled)."""

    graph: str
    backend: str
    config: tuple[tuple[str, Any], ...] = ()
    bisect_env: tuple[tuple[str, str], ...] = ()


def probe_key(probe: bisector.Probe, spec: JobSpec) -> Key:
    """What a bisector probe compiles. Its last stage is inductor, which an aot_inductor job
    compiles with aot_inductor; a config change is a config patch (the same compile as that
    setting's screen); a subsystem being disabled or counted goes by the environment protocol."""
    backend = spec.backend if probe.backend == bisector.FINAL_STAGE else probe.backend
    if probe.config:
        return Key("minimal", backend, probe.config)
    return Key("minimal", backend, (), tuple(sorted(probe.environment().items())) if probe.subsystem else ())


def screen_key(setting: tuple[str, Any], spec: JobSpec, graph: str = "minimal") -> Key:
    key, value = setting
    return Key(graph, value) if key == BACKEND else Key(graph, spec.backend, ((key, value),))


def verify_key(setting: tuple[str, Any], spec: JobSpec) -> Key:
    return screen_key(setting, spec, "original")


class Prober:
    """Probes in sandbox children, through the job's evaluator (its restarts, the pool's typed
    outcomes), memoized by what they compile, bounded by a deadline. Probes offered ahead
    (`offer`) start while fewer than the pool's parallelism run."""

    def __init__(self, evaluator: SandboxEvaluator, spec: JobSpec, target: Signature, timeout_s: float,
                 deadline: float, should_stop: Callable[[], str | None]) -> None:
        self.evaluator, self.spec, self.target, self.timeout_s = evaluator, spec, target, timeout_s
        self.deadline, self.should_stop = deadline, should_stop
        self.futures: dict[Key, Future[Outcome]] = {}
        self.known: dict[Key, str] = {}  # answered without a probe (`remember`), and how
        self.count = 0
        self.notes: list[str] = []
        self._ahead: list[tuple[Key, dict[str, Any], Path | None]] = []
        # A probe to offer (first) once the probe of this key passes: a screen's check on the original.
        self.on_pass: dict[Key, tuple[Key, dict[str, Any]]] = {}
        self._closed = False
        self._lock = threading.RLock()

    def submit(self, key: Key, wire_graph: dict[str, Any], state_dir: Path | None = None, *,
               again: bool = False, patience: float = 1.0) -> Future[Outcome]:
        """The probe's outcome: memoized unless `again` (run once more); `patience` multiplies its timeout."""
        kwargs = {"wire_graph": wire_graph, "backend": key.backend, "config": dict(key.config),
                  "bisect_env": dict(key.bisect_env) or None, "state_dir": str(state_dir) if state_dir else None}
        with self._lock:
            if key in self.futures and not again:
                return self.futures[key]
            self.count += 1
            future = self.evaluator.submit_call(CALL_TARGET, kwargs, timeout_s=self.timeout_s * patience,
                                                purpose="culprit probe")
            self.futures[key] = future
        future.add_done_callback(lambda done: None if done.cancelled() else self._done(key, done))
        return future

    def remember(self, key: Key, outcome: Outcome, why: str) -> None:
        """`key`'s outcome, known without running it (`why`)."""
        future: Future[Outcome] = Future()
        future.set_result(outcome)
        self.futures[key] = future
        self.known[key] = why

    def offer(self, probes: list[tuple[Key, dict[str, Any], Path | None]], *, first: bool = False) -> None:
        """Probes to start ahead, in this order, as slots free up (`first`: before those offered so far)."""
        with self._lock:
            self._ahead[:0 if first else len(self._ahead)] = probes
        self._start_ahead()

    def _done(self, key: Key, done: Future[Outcome]) -> None:
        follow = self.on_pass.get(key)
        if follow is not None and done.exception() is None and isinstance(done.result(), Passes):
            self.offer([(*follow, None)], first=True)
        else:
            self._start_ahead()

    def _start_ahead(self) -> None:
        with self._lock:
            while self._ahead and not self._closed and \
                    sum(not future.done() for future in self.futures.values()) < self.evaluator.pool.parallelism:
                key, wire_graph, state_dir = self._ahead.pop(0)
                if key not in self.futures:
                    self.submit(key, wire_graph, state_dir)

    def wait(self, futures: list[Future[Outcome]]) -> None:
        """Wait for `futures`; `OutOfBudget` past the deadline, `Stopped` on a stop."""
        pending = [future for future in futures if not future.done()]
        while pending:
            reason = self.should_stop()
            if reason:
                self.close()
                raise Stopped(reason)
            if time.monotonic() > self.deadline:
                raise OutOfBudget()
            wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
            pending = [future for future in pending if not future.done()]

    def fails(self, outcome: Outcome) -> bool:
        return oracle.still_fails(outcome, self.target, self.spec.failure)

    def close(self) -> None:
        """Cancel every probe still queued or running (their children die)."""
        with self._lock:
            self._closed = True
            self._ahead.clear()
            running = [future for future in self.futures.values() if not future.done()]
        for future in running:
            self.evaluator.cancel(future)
