"""The scheduler's view of the sandbox: programs in, typed outcomes out (`SandboxEvaluator`).

It owns what the sandbox's failures mean for a job: a fork server that died costs the candidates
in flight (`Invalid`) and the next submit restarts it; a child that could not run its candidate at
all (`SandboxFault`, e.g. CUDA unusable after a fork) restarts the sandbox spawned afresh and runs
the candidate again, up to `MAX_SANDBOX_RESTARTS`, unless a fresh sandbox would meet it too. Any
representation's program goes through it (`programs.Representation.to_wire`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from pathlib import Path
from typing import Any, TypeVar

from minify_worker.outcomes import Invalid, Outcome
from minify_worker.programs import Representation, representation
from minify_worker.sandbox import SandboxError, SandboxFault, SandboxPool

log = logging.getLogger(__name__)

MAX_SANDBOX_RESTARTS = 3

T = TypeVar("T")


def in_sandbox(workdir: Path, spec: Any, parallelism: int, run: Callable[[SandboxPool], T]) -> T:
    """`run(pool)` with a sandbox pool forked from the warm fork server, or, when the process it
    was forked from poisoned it (a fork-related `SandboxFault`: CUDA initialized there), with one
    spawned afresh. Raises `SandboxError` when no sandbox can start."""
    start: str | None = None
    while True:
        pool = SandboxPool(workdir, None, spec, parallelism=parallelism, start=start)
        try:
            return run(pool)
        except SandboxFault as fault:
            if pool.start_method != "fork" or not fault.fork_related:
                raise
            log.warning("the forked sandbox cannot run here (%s); spawning a fresh one", fault)
            start = "spawn"
        finally:
            pool.close()


class SandboxEvaluator:
    """The scheduler's view of the sandbox: graphs in, outcomes out, with the calibrated timeout.

    If the fork server itself dies (the OOM killer, or a candidate that kills its parent), the
    candidates that were in flight come back `Invalid` and the next submit starts a fresh fork
    server: it costs those candidates, not the job. A `SandboxFault` (a child that could not run
    its candidate at all, e.g. CUDA unusable after a fork) is never an outcome: the sandbox is
    restarted, spawned afresh, and the candidate runs again there; a fault that is not the fork's
    doing, CUDA unusable in the children of a server that was spawned already (a spawned server
    that initializes CUDA does so again), or one that outlives `MAX_SANDBOX_RESTARTS` restarts,
    fails the job with its cause.
    """

    def __init__(self, pool: SandboxPool, timeout_s: float, restart: Callable[[str | None], SandboxPool],
                 program: Representation | None = None) -> None:
        self.pool = pool
        self.program = program or representation("fx")
        self.timeout_s = timeout_s
        self.restarts = 0
        self._restart = restart
        self._dead: SandboxPool | None = None
        self._restart_start: str | None = None
        self._fault: SandboxFault | None = None
        self._fault_is_final = False  # a fresh sandbox would meet `_fault` too: no restart
        self._started: list[SandboxPool] = []
        self._inner: dict[Future[Outcome], Future[Outcome]] = {}
        self._lock = threading.RLock()
        self.on_outcome: Callable[[Any, Outcome], None] | None = None  # sees every outcome as it comes
        self.on_restart: Callable[[SandboxPool], None] | None = None  # sees each pool that replaces one
        self.spared: set[Future[Outcome]] = set()  # runs that keep their own timeout (the original's)

    def live_pool(self) -> SandboxPool:
        """The current pool, restarted first if its fork server died or a child faulted."""
        with self._lock:
            if self._dead is self.pool:
                if self._fault is not None and self._fault_is_final:
                    raise SandboxError(_final_fault(self._fault, self.restarts))
                if self.restarts >= MAX_SANDBOX_RESTARTS:
                    if self._fault is not None:
                        raise SandboxError(f"{self._fault} (still after {self.restarts} sandbox restarts)")
                    raise SandboxError(f"the fork server died {self.restarts + 1} times")
                self.restarts += 1
                log.warning("restarting the sandbox (%d): %s", self.restarts, self._fault or "the fork server died")
                self.pool = self._restart(self._restart_start)
                self._started.append(self.pool)
                if self.on_restart is not None:
                    self.on_restart(self.pool)
            return self.pool

    def submit(self, graph: Any, timeout_s: float | None = None, runs: int = 1,
               output: bool = False) -> Future[Outcome]:
        outer: Future[Outcome] = Future()

        def request(pool: SandboxPool) -> Future[Outcome]:
            return pool.submit(self.program.to_wire(graph), timeout_s=timeout_s or self.timeout_s, runs=runs,
                               output=output)

        self._submit(outer, request, graph)
        return outer

    def submit_call(self, target: str, kwargs: dict[str, Any], timeout_s: float,
                    purpose: str = "call") -> Future[Outcome]:
        """Run a call target that returns an outcome (`SandboxPool.submit_outcome_call`: a culprit
        probe), restarted as a candidate is; it keeps `timeout_s` (`set_timeout` leaves it) and its
        outcome is not a candidate's (`on_outcome` does not see it)."""
        outer: Future[Outcome] = Future()
        self.spared.add(outer)
        outer.add_done_callback(self.spared.discard)
        self._submit(outer, lambda pool: pool.submit_outcome_call(target, kwargs, timeout_s, purpose), None)
        return outer

    def _submit(self, outer: Future[Outcome], request: Callable[[SandboxPool], Future[Outcome]],
                graph: Any | None) -> None:
        """`request` on the live pool, its outcome settling `outer`; `graph`: the candidate's, for
        `on_outcome` (None: not a candidate)."""
        pool = self.live_pool()
        inner = request(pool)
        self._inner[outer] = inner

        def settle(done: Future[Outcome]) -> None:
            self._inner.pop(outer, None)
            error = None if done.cancelled() else done.exception()
            if done.cancelled():
                outer.cancel()
            elif isinstance(error, SandboxFault):
                self._faulted(pool, error)
                try:
                    self._submit(outer, request, graph)
                except SandboxError as final:
                    _settle(outer, error=final)
            elif isinstance(error, SandboxError):
                with self._lock:
                    self._dead = pool
                _settle(outer, result=Invalid(f"the sandbox's fork server died while this candidate ran: {error}"))
            elif error is not None:
                _settle(outer, error=error)
            else:
                if self.on_outcome is not None and graph is not None:
                    self.on_outcome(graph, done.result())
                _settle(outer, result=done.result())

        inner.add_done_callback(settle)

    def _faulted(self, pool: SandboxPool, fault: SandboxFault) -> None:
        with self._lock:
            if self._dead is pool or pool is not self.pool:
                return  # already restarted for this pool
            self._fault = fault
            self._dead = pool
            if fault.detail.strip():  # the child's last words, for the job's log
                log.warning("sandbox fault: %s; the child's output ended with:\n%s", fault, fault.detail.rstrip())
            # A fault that is not the fork's doing, or CUDA initialized in a server that was
            # spawned already, is what a fresh sandbox would meet as well.
            self._fault_is_final = not fault.fork_related or (fault.cuda_after_fork and pool.start_method != "fork")
            self._restart_start = "spawn"

    def set_timeout(self, timeout_s: float) -> None:
        """The timeout of every later candidate, and of those already submitted."""
        self.timeout_s = timeout_s
        for outer, inner in list(self._inner.items()):
            if outer not in self.spared:
                self.pool.set_timeout(inner, timeout_s)

    def cancel(self, future: Future[Outcome]) -> None:
        inner = self._inner.get(future)
        if inner is not None:
            self.pool.cancel(inner)
        future.cancel()

    def close(self) -> None:
        """Close the fork servers this evaluator started (the first pool belongs to the caller)."""
        for pool in self._started:
            pool.close()


def _final_fault(fault: SandboxFault, restarts: int) -> str:
    """Why the job's sandbox is not restarted again after `fault`."""
    if restarts == 0:
        return str(fault)
    return f"{fault} (a sandbox spawned afresh met it too, after {restarts} sandbox restart{'s' * (restarts != 1)})"


def _settle(future: Future[Outcome], *, result: Outcome | None = None, error: BaseException | None = None) -> None:
    """Resolve `future` unless it was cancelled meanwhile."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]
    except InvalidStateError:
        pass
