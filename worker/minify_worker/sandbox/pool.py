"""The parent's side of the sandbox: `SandboxPool` (requests to the fork server, futures, its
events turned into outcomes), the sandbox's exceptions, and `prepare_program`."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import shutil
import signal
import subprocess
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from minify_contract.models import JobSpec

from .. import oracle, programs
from ..outcomes import Crashed, Invalid, Outcome, OutOfMemory, TimedOut, outcome_from_dict
from ..programs.prepared import PreparedProgram, ProgramError
from . import failed_builds
from .child import ALLOWED_CALLS_ENV, call_allowed
from .limits import (
    ADDRESS_SPACE_ENV,
    ADDRESS_SPACE_SLACK_MB,
    default_memory_bound_mb,
    default_reuse,
    scrubbed_environment,
    usable_cores,
)
from .processes import ForkedProcess, write_line
from .server import ServerOptions, start_server
from .warmup import compile_cache_variables, fork_refusal

log = logging.getLogger(__name__)


class SandboxError(Exception):
    """The sandbox itself failed (the fork server died or could not start)."""


class SandboxFault(SandboxError):
    """A child could not run its request because of the sandbox, not the request: CUDA unusable in
    a forked child, torch not importable, a device this machine lacks. Never a candidate outcome:
    the job restarts its sandbox (spawned, when the fork origin is to blame) or fails with it."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail

    @property
    def fork_related(self) -> bool:
        """Whether a fork server started afresh (spawned, never touched CUDA) may not see it again."""
        return self.cuda_after_fork or "died before it ran" in str(self)

    @property
    def cuda_after_fork(self) -> bool:
        """CUDA was initialized in the process the child was forked from: a fork server spawned
        afresh that initializes it the same way meets it again, so only a forked one may be replaced."""
        return "forked subprocess" in str(self)


class PrepareStopped(Exception):
    """Preparing was stopped (cancelled, or out of time) before the program was loaded."""


class SandboxCallError(SandboxError):
    """A `SandboxPool.call` target raised, crashed or timed out in its child.

    `error_type` is the exception's type name when the target raised, else the outcome kind
    (`crashed`, `timed_out`, `oom`).
    """

    def __init__(self, message: str, error_type: str = "", detail: str = "") -> None:
        super().__init__(message)
        self.error_type = error_type
        self.detail = detail


@dataclass
class _Pending:
    future: Future
    kind: str  # "candidate" | "call" | "load_values"
    purpose: str
    timeout_s: float | None
    returns_outcome: bool = False  # a call whose target returns an outcome (`submit_outcome_call`)
    output: bool = False  # its outcome carries what its child printed (`submit(output=True)`)


class SandboxPool:
    """Children forked from one warm fork server; see the package docstring (`sandbox/__init__.py`)."""

    def __init__(self, workdir: Path, values: Path | PreparedProgram | None, spec: JobSpec, parallelism: int = 1, *,
                 threads_per_child: int | None = None, warm: bool = True,
                 env: dict[str, str] | None = None, start: str | None = None,
                 reuse: int | None = None) -> None:
        self.workdir = Path(workdir).resolve()
        self.root = self.workdir / "sandbox"
        self.spec = spec
        self.parallelism = max(1, parallelism)
        # Each candidate's process group is killed past this resident memory (an `oom` outcome).
        self.memory_bound_mb = spec.limits.memory_mb or default_memory_bound_mb(self.parallelism)
        # Candidates run in long-lived children, this many each (0: a fresh child per candidate).
        self.reuse = default_reuse(spec) if reuse is None else reuse
        self.threads_per_child = threads_per_child or max(1, usable_cores() // self.parallelism)
        for sub in ("results", "logs", "tmp", "cache", "triton"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._pids: weakref.WeakKeyDictionary[Future, int] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._closed = False
        self._dead_reason: str | None = None
        self._ready = threading.Event()
        self._ready_info: dict[str, Any] = {}
        self._spawned = threading.Event()
        self._spawn_error: BaseException | None = None
        self._process: subprocess.Popen | ForkedProcess | None = None
        self._request_w: int | None = None
        values_path = values.values_path if isinstance(values, PreparedProgram) else values
        self._options = ServerOptions(
            root=self.root, workdir=self.workdir, spec_json=spec.model_dump_json(), parallelism=self.parallelism,
            threads=self.threads_per_child, parent_pid=os.getpid(),
            values=None if values_path is None else Path(values_path).resolve(), warm=warm,
            memory_mb=self.memory_bound_mb, reuse=self.reuse,
        )
        refusal = "asked to spawn" if start == "spawn" else fork_refusal()
        self.start_method = "spawn" if refusal else "fork"
        if refusal:
            log.debug("sandbox: spawning the fork server (%s)", refusal)
        self._environment = self._server_environment(env)
        # The I/O thread starts the server: PR_SET_PDEATHSIG follows the thread that forked it,
        # and this thread lives exactly as long as the pool. (Its fresh context also means that a
        # forked server sees inductor's defaults, not config overrides of whoever made the pool:
        # inductor keeps those per thread context. Children see the spec's config only.)
        self._thread = threading.Thread(target=self._serve, name="minify-sandbox-io", daemon=True)
        self._thread.start()
        self._spawned.wait()
        if self._spawn_error is not None:
            raise SandboxError(f"cannot start the fork server: {self._spawn_error}") from self._spawn_error

    def _server_environment(self, extra: dict[str, str] | None) -> dict[str, str]:
        environment = scrubbed_environment(dict(os.environ))
        environment.update({
            "TMPDIR": str(self.root / "tmp"),
            **compile_cache_variables(self.root),
            failed_builds.FOLDER_VARIABLE: str(self.root / "failed-builds"),
            "TORCHINDUCTOR_COMPILE_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            "PYTORCH_NVML_BASED_CUDA_CHECK": os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK", "1"),
            ADDRESS_SPACE_ENV: str(self.memory_bound_mb + ADDRESS_SPACE_SLACK_MB),
        })
        environment.update(extra or {})
        return environment

    # -- public API ---------------------------------------------------------------------------

    def submit(self, wire_graph: dict[str, Any], timeout_s: float | None,
               purpose: str = "candidate", fresh: bool = False, runs: int = 1,
               output: bool = False) -> Future[Outcome]:
        """Run one candidate in a child; the future resolves with its `Outcome`. With `fresh`, in a
        child that ran no other candidate before (every child is fresh unless the pool reuses them);
        with `runs`, compiled once and run that many times (`Representation.run_wire_candidate`); with `output`,
        the outcome's `output` is the tail of what the child printed (the original's, for its report)."""
        payload = {"graph": wire_graph, "fresh": fresh, "runs": runs, "output": output}
        return self._request("candidate", payload, timeout_s, purpose)

    def submit_call(self, target: str, kwargs: dict[str, Any] | None = None, timeout_s: float | None = 600.0,
                    purpose: str = "call") -> Future[dict[str, Any]]:
        """Run `target(context, **kwargs)` in a child; the future resolves with its dict or raises
        `SandboxCallError`."""
        return self._call(target, kwargs, timeout_s, purpose, returns_outcome=False)

    def submit_outcome_call(self, target: str, kwargs: dict[str, Any] | None = None, timeout_s: float | None = None,
                            purpose: str = "call") -> Future[Outcome]:
        """Run `target(context, **kwargs)`, which returns an outcome (`outcome_to_dict`), in a child of
        its own; the future resolves with that `Outcome`, as `submit`'s with a candidate's: a child that
        crashed, hung or ran out of memory is that outcome, a target that raised is `Invalid`."""
        return self._call(target, kwargs, timeout_s, purpose, returns_outcome=True)

    def call(self, target: str, kwargs: dict[str, Any] | None = None,
             timeout_s: float | None = 600.0) -> dict[str, Any]:
        """`submit_call(...).result()`."""
        return self.submit_call(target, kwargs, timeout_s).result()

    def load_values(self, values_path: Path, timeout_s: float = 600.0) -> None:
        """Load (or replace) the value store in the fork server; later children see it."""
        future = self._request("load_values", {"path": str(Path(values_path).resolve())}, None, "load_values")
        future.result(timeout=timeout_s)

    def cancel(self, future: Future) -> bool:
        """Cancel a submitted request: a queued one never starts, a running child is killed."""
        return future.cancel()

    def set_timeout(self, future: Future, timeout_s: float | None) -> None:
        """Change a submitted request's timeout (counted from its child's start, as before)."""
        with self._lock:
            request_id = next((rid for rid, item in self._pending.items() if item.future is future), None)
            if request_id is None:
                return
            self._pending[request_id].timeout_s = timeout_s
        self._send({"op": "timeout", "id": request_id, "timeout_s": timeout_s}, quiet=True)

    def wait_ready(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Wait for the server's warm-up; returns its report (warmup_s, cuda_initialized, ...)."""
        if not self._ready.wait(timeout_s):
            if self._dead_reason:
                raise SandboxError(self._dead_reason)
            raise SandboxError(f"the fork server is not ready after {timeout_s} s")
        return dict(self._ready_info)

    def child_pid(self, future: Future) -> int | None:
        """The pid of the child that ran (or runs) `future`'s request, once it started."""
        return self._pids.get(future)

    @property
    def server_pid(self) -> int | None:
        return self._process.pid if self._process else None

    def close(self) -> None:
        """Kill every child, stop the server, reap, and remove `workdir/sandbox`."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending = list(self._pending.values())
            self._pending.clear()
        for item in pending:
            item.future.cancel()  # kills its child, if one runs
        with self._lock:
            request_w, self._request_w = self._request_w, None
        if request_w is not None:
            os.close(request_w)  # EOF: the server kills its children, reaps them and exits
        process = self._process
        if process is not None:
            _stop_server(process, self._ready.is_set())
        self._thread.join(timeout=15)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- plumbing -----------------------------------------------------------------------------

    def _call(self, target: str, kwargs: dict[str, Any] | None, timeout_s: float | None, purpose: str, *,
              returns_outcome: bool) -> Future:
        if not call_allowed(target, self._environment):
            raise ValueError(f"call target {target!r} must be 'minify_worker.module:function' "
                             f"(or in a module the pool's {ALLOWED_CALLS_ENV} allows)")
        return self._request("call", {"target": target, "kwargs": kwargs or {}}, timeout_s, purpose,
                             returns_outcome=returns_outcome)

    def _request(self, kind: str, payload: dict[str, Any], timeout_s: float | None, purpose: str, *,
                 returns_outcome: bool = False) -> Future:
        request_id = next(self._ids)
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise SandboxError("the sandbox pool is closed")
            if self._dead_reason:
                raise SandboxError(self._dead_reason)
            self._pending[request_id] = _Pending(future, kind, purpose, timeout_s, returns_outcome,
                                                 bool(payload.get("output")))
        future.add_done_callback(lambda done: self._on_done(request_id, done))
        self._send({"op": "run", "id": request_id, "kind": kind, "purpose": purpose,
                    "timeout_s": timeout_s, **payload})
        return future

    def _on_done(self, request_id: int, future: Future) -> None:
        if future.cancelled():
            self._send({"op": "kill", "id": request_id}, quiet=True)

    def _send(self, message: dict[str, Any], quiet: bool = False) -> None:
        with self._lock:
            if self._request_w is None:
                if quiet:
                    return
                raise SandboxError(self._dead_reason or "the sandbox pool is closed")
            try:
                write_line(self._request_w, message)
            except OSError as error:
                if not quiet:
                    raise SandboxError(self._dead_reason or f"the fork server is gone: {error}") from error

    def _serve(self) -> None:
        request_r, request_w = os.pipe()
        event_r, event_w = os.pipe()
        try:
            self._process = start_server(self._options, request_r, event_w, self._environment, self.start_method)
        except BaseException as error:
            for fd in (request_r, request_w, event_r, event_w):
                os.close(fd)
            self._spawn_error = error
            self._spawned.set()
            return
        os.close(request_r)
        os.close(event_w)
        self._request_w = request_w
        self._spawned.set()
        with os.fdopen(event_r, "rb") as events:
            for line in events:
                try:
                    self._handle_event(json.loads(line))
                except Exception:
                    log.exception("sandbox: bad event from the fork server")
        code = self._process.wait()
        reason = self._dead_reason or f"the fork server exited (status {code})"
        with self._lock:
            self._dead_reason = reason
            if self._request_w is not None:
                os.close(self._request_w)
                self._request_w = None
            pending = list(self._pending.values())
            self._pending.clear()
        for item in pending:
            _resolve(item.future, error=SandboxError(reason))

    def _handle_event(self, event: dict[str, Any]) -> None:
        name = event.get("event")
        if name == "ready":
            self._ready_info = event
            self._ready.set()
        elif name == "warm":
            log.debug("fork server warm: %s", event)
            self._ready_info.update({key: event[key] for key in ("warmup_s", "cuda_initialized") if key in event})
        elif name == "fatal":
            self._dead_reason = f"the fork server failed: {event.get('message')}"
        elif name == "started":
            with self._lock:
                pending = self._pending.get(event["id"])
            if pending is not None:
                self._pids[pending.future] = event["pid"]
        elif name == "done":
            with self._lock:
                pending = self._pending.pop(event["id"], None)
            if pending is not None:
                _finish(pending, event)


def _stop_server(process: subprocess.Popen | ForkedProcess, ready: bool) -> None:
    """Stop a fork server whose request pipe was just closed, and reap it.

    A serving server reads the EOF at once, kills its children, reaps them and exits. One still
    starting (a spawned server importing torch, or warming inductor up) reads nothing for seconds:
    SIGTERM, whose handler exits through the same shutdown. SIGKILL last (its children follow by
    PR_SET_PDEATHSIG)."""
    try:
        process.wait(timeout=2.0 if ready else 0.2)
        return
    except subprocess.TimeoutExpired:
        pass
    try:
        os.kill(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _resolve(future: Future, *, result: Any = None, error: BaseException | None = None) -> None:
    if future.done():
        return
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except Exception:  # cancelled concurrently
        pass


def _finish(pending: _Pending, event: dict[str, Any]) -> None:
    if pending.future.cancelled():
        return
    result = event.get("result")
    fault = sandbox_fault_of(event)
    if fault is not None:
        _resolve(pending.future, error=fault)
        return
    if pending.kind == "candidate":
        outcome = outcome_of_child(event, pending.timeout_s)
        tail = event.get("log_tail") or ""
        if pending.output:
            outcome = dataclasses.replace(outcome, output=tail)
        elif tail.strip():  # a child that died or could not run: its last words go to the job's log
            log.info("%s %s; its output ended with:\n%s", pending.purpose, outcome.kind, tail.rstrip())
        _resolve(pending.future, result=outcome)
        return
    if pending.returns_outcome:
        _resolve(pending.future, result=_call_outcome(event, pending.timeout_s))
        return
    if isinstance(result, dict) and result.get("ok"):
        _resolve(pending.future, result=result.get("value"))
        return
    if isinstance(result, dict):
        error_type, message = result.get("error_type", ""), result.get("error", "failed")
        detail = result.get("traceback", "")
    else:
        outcome = outcome_of_child(event, pending.timeout_s)
        error_type, message, detail = outcome.kind, _describe(outcome), event.get("log_tail", "")
    _resolve(pending.future, error=SandboxCallError(f"{pending.purpose} failed in its child: {message}",
                                                    error_type, detail))


def _call_outcome(event: dict[str, Any], timeout_s: float | None) -> Outcome:
    """The outcome of a call whose target returns one: what it returned, `Invalid` when it raised,
    else how its child ended (`outcome_of_child`)."""
    result = event.get("result")
    if isinstance(result, dict) and result.get("ok"):
        return outcome_from_dict(result["value"])
    if isinstance(result, dict) and "error" in result:
        return Invalid(message=str(result["error"]))
    return outcome_of_child(event, timeout_s)


def _describe(outcome: Outcome) -> str:
    if isinstance(outcome, Crashed):
        return str(outcome.signature)
    if isinstance(outcome, TimedOut):
        return f"after {outcome.after_s:.1f} s"
    return getattr(outcome, "message", "")


def sandbox_fault_of(event: dict[str, Any]) -> SandboxFault | None:
    """The sandbox's own failure a child's report shows, if any (never a candidate's outcome)."""
    result = event.get("result")
    if isinstance(result, dict) and "sandbox_error" in result:
        return SandboxFault(str(result["sandbox_error"]), detail=event.get("log_tail", ""))
    if event.get("setup_failed"):
        how = (f"killed by {oracle.signal_name(event['signal'])}" if event.get("signal")
               else f"exit status {event.get('exit_code')}")
        tail = (event.get("log_tail") or "").strip().splitlines()
        return SandboxFault(f"a sandbox child died before it ran its request ({how})"
                            + (f": {tail[-1]}" if tail else ""), detail=event.get("log_tail", ""))
    return None


def outcome_of_child(event: dict[str, Any], timeout_s: float | None) -> Outcome:
    """The outcome of one candidate child from the server's report of how it ended."""
    wall = float(event.get("wall_s") or 0.0)
    result = event.get("result")
    if isinstance(result, dict) and "outcome" in result:
        return outcome_from_dict(result["outcome"])
    if event.get("over_memory"):
        return OutOfMemory(message=f"exceeded the memory bound of {event.get('memory_bound_mb')} MiB "
                                   "(resident, the child and what it started)", duration_s=wall)
    if event.get("timed_out"):
        return TimedOut(after_s=wall)
    if isinstance(result, dict) and "error" in result:
        return Invalid(message=f"sandbox child error: {result['error']}", duration_s=wall)
    number = event.get("signal")
    if number:
        if number == signal.SIGKILL and not event.get("killed"):
            return OutOfMemory(message="killed by SIGKILL without a timeout or cancel "
                                       "(most likely the kernel's OOM killer)", duration_s=wall)
        return Crashed(signal=number, signature=oracle.crash_signature(number), duration_s=wall)
    code = int(event.get("exit_code") or 0)
    return Crashed(signal=0, signature=oracle.exit_signature(code), duration_s=wall)


class _Cancels(Protocol):
    def cancel(self, future: Future) -> object: ...


def wait_unless_stopped(pool: _Cancels, futures: list[Future],
                        should_stop: Callable[[], str | None] | None) -> str | None:
    """Wait for every future; if `should_stop` answers a reason first, cancel them all through
    `pool` (a `SandboxPool`, or whatever submitted them: their children die) and return that reason."""
    while not all(future.done() for future in futures):
        reason = should_stop() if should_stop is not None else None
        if reason:
            for future in futures:
                pool.cancel(future)
            return reason
        wait(futures, timeout=0.05)
    return None


def prepare_program(program: Path, inputs: Path | None, workdir: Path, spec: JobSpec, *,
                    timeout_s: float | None = 600.0, pool: SandboxPool | None = None,
                    should_stop: Callable[[], str | None] | None = None,
                    target: str | None = None) -> PreparedProgram:
    """Run the loader in a sandbox child: values.pt and program.json into `workdir`. `target`: a
    loader (`module:function`), by default the one of the spec's representation
    (`programs.Representation.prepare_target`).

    Uses `pool` if given (it need not have a value store yet), else a one-shot pool without
    inductor warm-up. Any failure (a bad file, inputs that do not fit, a crash or hang while
    loading) raises `ProgramError` with a message for the user. When `should_stop` answers a
    reason (a cancel, a job deadline), the loading child is killed and `PrepareStopped` raised.

    First the representation checks the upload in this process, which rebuilds what the loader
    writes (`Representation.check_upload`; FX: the spec's `op_modules` imported, for the custom ops
    of the program's graph), raising `ProgramError` for what is missing.
    """
    representation = programs.of_format(spec.program_format)
    representation.check_upload(Path(program), spec)
    target = target or representation.prepare_target
    own_pool = pool is None
    active = pool or SandboxPool(workdir, None, spec, 1, warm=False)
    kwargs = {"program": str(Path(program).resolve()),
              "inputs": None if inputs is None else str(Path(inputs).resolve())}
    try:
        future = active.submit_call(target, kwargs, timeout_s, purpose="prepare")
        reason = wait_unless_stopped(active, [future], should_stop)
        if reason:
            raise PrepareStopped(reason)
        future.result()
    except SandboxCallError as error:
        if error.error_type == "ProgramError":
            raise ProgramError(str(error).split("ProgramError: ", 1)[-1]) from None
        if error.error_type in ("crashed", "timed_out", "oom"):
            raise ProgramError(f"loading the program failed: {error.error_type} ({error})") from None
        raise ProgramError(f"cannot prepare the program: {error}") from None
    finally:
        if own_pool:
            active.close()
    return PreparedProgram.read(workdir)
