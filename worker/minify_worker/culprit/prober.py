"""The culprit phase's probes, in the engine's process: what a probe compiles (`Key`), and
`Prober`, which runs them in sandbox children (`probe.probe_in_child`), memoized, started ahead
as slots free up, bounded by the phase's deadline."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minify_client.models import JobSpec
from minify_worker import bisector, oracle
from minify_worker.outcomes import (
    Crashed,
    Invalid,
    Outcome,
    OutOfMemory,
    Passes,
    Signature,
    TimedOut,
    outcome_from_dict,
)
from minify_worker.sandbox import SandboxCallError, SandboxPool

from .settings import BACKEND

CALL_TARGET = "minify_worker.culprit.probe:probe_in_child"


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
    """Probes in sandbox children, memoized by what they compile, bounded by a deadline. Probes
    offered ahead (`offer`) start while fewer than the pool's parallelism run."""

    def __init__(self, pool: SandboxPool, spec: JobSpec, target: Signature, timeout_s: float, deadline: float,
                 should_stop: Callable[[], str | None]) -> None:
        self.pool, self.spec, self.target, self.timeout_s = pool, spec, target, timeout_s
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
        with self._lock:
            if key in self.futures and not again:
                return self.futures[key]
            self.count += 1
            outer: Future[Outcome] = Future()
            self.futures[key] = outer
        kwargs = {"wire_graph": wire_graph, "backend": key.backend, "config": dict(key.config),
                  "bisect_env": dict(key.bisect_env) or None, "state_dir": str(state_dir) if state_dir else None}
        timeout_s = self.timeout_s * patience
        inner = self.pool.submit_call(CALL_TARGET, kwargs, timeout_s=timeout_s, purpose="culprit probe")
        inner.add_done_callback(lambda done: _settle_outcome(outer, done, timeout_s))
        outer.add_done_callback(lambda done: self.pool.cancel(inner) if done.cancelled() else self._done(key, done))
        return outer

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
        if follow is not None and isinstance(done.result(), Passes):
            self.offer([(*follow, None)], first=True)
        else:
            self._start_ahead()

    def _start_ahead(self) -> None:
        with self._lock:
            while self._ahead and not self._closed and \
                    sum(not future.done() for future in self.futures.values()) < self.pool.parallelism:
                key, wire_graph, state_dir = self._ahead.pop(0)
                if key not in self.futures:
                    self.submit(key, wire_graph, state_dir)

    def wait(self, futures: list[Future[Outcome]]) -> None:
        """Wait for `futures`; `OutOfBudget` past the deadline, `Stopped` on a stop."""
        from minify_worker.scheduler import Stopped

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
            future.cancel()


def _settle_outcome(outer: Future[Outcome], done: Future[dict[str, Any]], timeout_s: float) -> None:
    if outer.done():
        return
    if done.cancelled():
        outer.cancel()
        return
    error = done.exception()
    try:
        outer.set_result(_outcome_of_call_error(error, timeout_s) if error else outcome_from_dict(done.result()))
    except Exception:  # cancelled meanwhile
        pass


def _outcome_of_call_error(error: BaseException, timeout_s: float) -> Outcome:
    """A probe child that died, hung or ran out of memory, as the outcome a candidate would have."""
    if not isinstance(error, SandboxCallError):
        return Invalid(message=f"the probe could not run: {type(error).__name__}: {error}")
    message = str(error).split("failed in its child: ", 1)[-1]
    if error.error_type == "crashed":
        # The call's message is the crash's signature as str() writes it: a signal name, or an exit status.
        name, _, code = message.partition(": ")
        if name == "ExitStatus" and code.lstrip("-").isdigit():
            return Crashed(signal=0, signature=oracle.exit_signature(int(code)))
        number = getattr(signal.Signals, name, None)
        if number is not None:
            return Crashed(signal=int(number), signature=oracle.crash_signature(int(number)))
        return Crashed(signal=0, signature=Signature(kind="crash", exc_type="Crashed", key="", text=message))
    if error.error_type == "timed_out":
        return TimedOut(after_s=timeout_s)
    if error.error_type == "oom":
        return OutOfMemory(message=message)
    return Invalid(message=message)
