"""Run candidates in child processes forked from a warm fork server (ARCHITECTURE.md, "Isolation model").

Processes::

    parent (engine)                      fork server (python -m minify_worker.sandbox)
      SandboxPool ──requests (pipe)──▶     imports torch + inductor, never CUDA, no tensor ops
                  ◀──events (pipe)────     loads values.pt (mmap, weights_only)
                                           forks one child per request ──▶ child: setsid, run, write result, _exit

The parent talks to the server over two private pipes (JSON lines), never over stdout: children
inherit stdout, and user code prints. The server is the only one that forks, waits and kills, so
a pid can never be reused under it: it enforces each request's timeout, kills a child's whole
process group (`os.killpg`: the child and what it started, e.g. a C++ compiler) on timeout,
cancel or shutdown, reaps every child (it is a child subreaper, so orphaned grandchildren come
back to it), and reports how each child ended. A killed parent leaves nothing behind: the server
has `PR_SET_PDEATHSIG=SIGKILL` towards the pool's I/O thread, every child towards the server,
and a tiny guardian process (forked by the server before it imports torch) kills the process
group of every child still registered with it when the server dies, so that what a child
started (a compiler, a `sleep`) dies too.

Everything the pool writes lives under `workdir/sandbox/` (result files, child logs, TMPDIR,
inductor and triton caches) and `close()` removes it; the rest of `workdir` is the caller's.

API (parent side)::

    pool = SandboxPool(workdir, values_path, spec, parallelism)   # values_path may be None
    future = pool.submit(wire_graph, timeout_s, purpose="candidate")   # Future[Outcome]
    pool.cancel(future)               # or future.cancel(): kills that child
    pool.set_timeout(future, 30.0)    # a new timeout for a queued or running request
    value = pool.call("minify_worker.artifacts:write_minimized", kwargs, timeout_s)   # -> dict
    pool.load_values(values_path)     # (re)load the value store in the server, e.g. after prepare
    pool.wait_ready(timeout_s)        # -> the server's warm-up report
    pool.close()                      # kills everything, reaps, removes workdir/sandbox

A call target is a module-level function of `minify_worker` called in a child as
`fn(context: ChildContext, **kwargs) -> dict` (JSON-safe); the context carries the value store.
How a child ended becomes an `Outcome` here: its reported outcome, else `TimedOut` (killed at its
deadline), `Crashed(signal)`, `OutOfMemory` for an unexplained SIGKILL (the kernel's OOM killer),
or `Crashed(0, ExitStatus)` for an exit without a report.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import itertools
import json
import logging
import os
import re
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from minify_client.models import JobSpec

from . import oracle
from .loader import PreparedProgram, ProgramError
from .outcomes import Crashed, Invalid, Outcome, OutOfMemory, TimedOut, outcome_from_dict, outcome_to_dict

log = logging.getLogger(__name__)

CALL_PREFIX = "minify_worker."
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_LOG_TAIL = 4000
MEMORY_CHECK_INTERVAL_S = 0.2
CHILD_OPEN_FILES = 4096
# Long-lived children (reuse): how many candidates one runs before it is replaced, on CUDA by
# default; how much its resident memory may grow over its start before it is; how many of them may
# fail to start in a row before candidates fail with the reason.
DEFAULT_REUSE_CUDA = 50
REUSE_MEMORY_GROWTH_MB = 2048
MAX_WORKER_START_FAILURES = 2
# A torch child maps about 1 GB of address space it never touches (libraries, arenas, stacks): the
# address-space bound is the memory bound plus this.
ADDRESS_SPACE_SLACK_MB = 4096
# The address-space bound (MiB) children of CPU jobs get, set by the pool in the server's environment.
_ADDRESS_SPACE_ENV = "MINIFY_SANDBOX_ADDRESS_SPACE_MB"


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
        return "forked subprocess" in str(self) or "died before it ran" in str(self)


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
class ChildContext:
    """What a `SandboxPool.call` target receives."""

    workdir: Path
    spec: JobSpec
    values: dict[str, Any]


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


# ---------------------------------------------------------------------------------------------
# Parent side
# ---------------------------------------------------------------------------------------------


def compile_cache_dir(job_root: Path) -> Path:
    """Where compilers keep their caches: shared by the jobs of one machine unless told otherwise.

    Inductor's and triton's caches (and inductor's precompiled headers and CPU ISA probe) are what
    make a warm compile cost a fraction of a cold one; a per-job cache would pay the cold price in
    every job. Entries are keyed by graph, config and torch version, and failed compiles are never
    cached, so a shared cache cannot change an outcome. `MINIFY_CACHE_DIR` moves it;
    `MINIFY_CACHE_DIR=job` keeps it inside the job's work dir (removed with the job).
    """
    configured = os.environ.get("MINIFY_CACHE_DIR", "")
    if configured == "job":
        return job_root / "cache"
    if configured:
        base = Path(configured)
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "minify"
    import torch.version

    path = base / f"torch-{torch.version.__version__}"
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass(frozen=True)
class _ServerOptions:
    """What the fork server is started with: its command line when spawned, its arguments when forked."""

    root: Path
    workdir: Path
    spec_json: str
    parallelism: int
    threads: int
    parent_pid: int
    values: Path | None
    warm: bool
    memory_mb: int | None = None
    reuse: int = 0

    def argv(self) -> list[str]:
        argv = ["--root", str(self.root), "--workdir", str(self.workdir), "--spec", self.spec_json,
                "--parallelism", str(self.parallelism), "--threads", str(self.threads),
                "--parent-pid", str(self.parent_pid)]
        if self.memory_mb:
            argv += ["--memory-mb", str(self.memory_mb)]
        if self.reuse:
            argv += ["--reuse", str(self.reuse)]
        if self.values is not None:
            argv += ["--values", str(self.values)]
        if not self.warm:
            argv.append("--no-warm")
        return argv


# Set by `preload()`, in this process and (through an at-fork hook) in every process forked from
# it while it was still clean: how many native threads beyond Python's own it had then. More now
# means a native thread pool (OpenMP, most likely) started since, and a process forked from here
# would hang in its first parallel region: OpenMP's threads do not survive a fork.
_fork_origin_native_threads: int | None = None
# Whether the origin also ran inductor's CPU warm-up (ISA probe, a compile), which the fork server
# then inherits instead of running it per job.
_fork_origin_warm = False
_clean_at_fork = False


def preload(warm: bool = True) -> dict[str, float]:
    """Make this process an origin the sandbox may fork its fork server from (a zygote).

    Imports torch and what the candidates need and, with `warm`, runs inductor's CPU warm-up (its
    vector-ISA probe and one compile, no kernel run) against the machine's compile cache: never
    CUDA, no tensor op, no thread. A later `SandboxPool` then forks its server from here instead of
    starting a fresh interpreter that imports and warms up all over again (seconds per job). The
    RQ worker calls it once at start and every work horse inherits it. Without it, or once this
    process has started a native thread pool or initialized CUDA (see `fork_refusal`), pools spawn
    their server.
    """
    global _fork_origin_warm
    started = time.monotonic()
    _import_compiler_modules()
    imported = time.monotonic()
    before = _native_threads_beyond_python()
    warmed = False
    if warm and os.environ.get("MINIFY_CACHE_DIR", "") != "job":
        with _compile_cache_environment():
            _warm_inductor_cpu()
        warmed = True
    timings = {"imports_s": round(imported - started, 3), "warmup_s": round(time.monotonic() - imported, 3)}
    if _native_threads_beyond_python() > before:
        log.warning("sandbox: the warm-up started native threads; pools will spawn their fork server")
        return timings
    if _fork_origin_native_threads is None:
        os.register_at_fork(before=_check_clean_before_fork, after_in_child=_mark_child_of_clean_origin)
    _fork_origin_warm = warmed
    _mark_fork_origin()
    return timings


def _mark_fork_origin() -> None:
    global _fork_origin_native_threads
    _fork_origin_native_threads = _native_threads_beyond_python()


def _check_clean_before_fork() -> None:
    global _clean_at_fork
    _clean_at_fork = fork_refusal() is None


def _mark_child_of_clean_origin() -> None:
    global _fork_origin_native_threads
    if _clean_at_fork:
        _mark_fork_origin()
    else:
        _fork_origin_native_threads = None


def _compile_cache_variables(job_root: Path) -> dict[str, str]:
    """The environment that points inductor and triton at `compile_cache_dir(job_root)`."""
    caches = compile_cache_dir(job_root)
    return {"TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"), "TRITON_CACHE_DIR": str(caches / "triton")}


@contextmanager
def _compile_cache_environment() -> Iterator[None]:
    """Point inductor and triton at the machine's compile cache (as pools do) for a while."""
    wanted = _compile_cache_variables(Path(tempfile.gettempdir()))
    saved = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _native_threads_beyond_python() -> int:
    try:
        tasks = len(os.listdir("/proc/self/task"))
    except OSError:
        return 1 << 30
    return tasks - threading.active_count()


def fork_refusal() -> str | None:
    """Why a fork server may not be forked from this process now (None: it may)."""
    if os.environ.get("MINIFY_SANDBOX_START", "").lower() == "spawn":
        return "MINIFY_SANDBOX_START=spawn"
    if _fork_origin_native_threads is None:
        return "this process was not preloaded"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialized in this process"
    if _native_threads_beyond_python() > _fork_origin_native_threads:
        return "a native thread pool started in this process since preload()"
    return None


class _ForkedServer:
    """The part of `subprocess.Popen` the pool uses, for a fork server forked from this process."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self, flags: int = os.WNOHANG) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, flags)
            except ChildProcessError:
                self.returncode = -1
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            return self.poll(flags=0)  # type: ignore[return-value]
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"fork server {self.pid}", timeout)
            time.sleep(0.02)
        return self.returncode  # type: ignore[return-value]

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _fork_server(options: _ServerOptions, request_fd: int, event_fd: int,
                 environment: dict[str, str]) -> _ForkedServer:
    """Fork the fork server from this (preloaded) process; in the child, serve and never return."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "multi-threaded, fork() may deadlock": see below
        pid = os.fork()
    if pid:
        return _ForkedServer(pid)
    # Only the forking thread lives on here. Python re-initializes the import lock, logging's
    # locks and the GIL after a fork; nothing else this child touches was held by another thread.
    code = 70
    try:
        _detach_inherited_descriptors(keep={request_fd, event_fd})
        os.environ.clear()
        os.environ.update(environment)
        tempfile.tempdir = None  # computed again from the new TMPDIR
        os.chdir(options.root / "tmp")
        _reset_signal_handlers()
        code = _run_server(options, request_fd, event_fd)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def _detach_inherited_descriptors(keep: set[int]) -> None:
    """Point every inherited descriptor but stdin/out/err and `keep` at /dev/null; stdin and stdout too.

    A spawned server closes them (close_fds); a forked one must not hold the parent's pipes
    (another pool's request pipe would then never see EOF) or sockets. They become /dev/null rather
    than closed, so that an object of the parent's that closes its descriptor later cannot close
    a reused number.
    """
    null = os.open(os.devnull, os.O_RDWR)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd in keep or fd in (2, null):
            continue
        try:
            os.dup2(null, fd)
        except OSError:
            pass  # the listing's own descriptor, already closed
    os.close(null)


def _reset_signal_handlers() -> None:
    """Python-level handlers of the parent's go; ignored signals stay ignored, as across exec."""
    signal.set_wakeup_fd(-1)
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                   signal.SIGUSR2, signal.SIGALRM, signal.SIGCHLD):
        if callable(signal.getsignal(number)):
            signal.signal(number, signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL)


@dataclass
class _Pending:
    future: Future
    kind: str  # "candidate" | "call" | "load_values"
    purpose: str
    timeout_s: float | None


class SandboxPool:
    """Children forked from one warm fork server; see the module docstring."""

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
        self._process: subprocess.Popen | _ForkedServer | None = None
        self._request_w: int | None = None
        values_path = values.values_path if isinstance(values, PreparedProgram) else values
        self._options = _ServerOptions(
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
            **_compile_cache_variables(self.root),
            "TORCHINDUCTOR_COMPILE_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            "PYTORCH_NVML_BASED_CUDA_CHECK": os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK", "1"),
            _ADDRESS_SPACE_ENV: str(self.memory_bound_mb + ADDRESS_SPACE_SLACK_MB),
        })
        environment.update(extra or {})
        return environment

    # -- public API ---------------------------------------------------------------------------

    def submit(self, wire_graph: dict[str, Any], timeout_s: float | None,
               purpose: str = "candidate", fresh: bool = False) -> Future[Outcome]:
        """Run one candidate in a child; the future resolves with its `Outcome`. With `fresh`, in a
        child that ran no other candidate before (every child is fresh unless the pool reuses them)."""
        return self._request("candidate", {"graph": wire_graph, "fresh": fresh}, timeout_s, purpose)

    def submit_call(self, target: str, kwargs: dict[str, Any] | None = None, timeout_s: float | None = 600.0,
                    purpose: str = "call") -> Future[dict[str, Any]]:
        """Run `target(context, **kwargs)` in a child; the future resolves with its dict or raises
        `SandboxCallError`."""
        module, _, name = target.partition(":")
        if not module.startswith(CALL_PREFIX) or not name:
            raise ValueError(f"call target {target!r} must be 'minify_worker.module:function'")
        return self._request("call", {"target": target, "kwargs": kwargs or {}}, timeout_s, purpose)

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
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()  # its children follow by PR_SET_PDEATHSIG
                process.wait()
        self._thread.join(timeout=15)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- plumbing -----------------------------------------------------------------------------

    def _request(self, kind: str, payload: dict[str, Any], timeout_s: float | None, purpose: str) -> Future:
        request_id = next(self._ids)
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise SandboxError("the sandbox pool is closed")
            if self._dead_reason:
                raise SandboxError(self._dead_reason)
            self._pending[request_id] = _Pending(future, kind, purpose, timeout_s)
        future.add_done_callback(lambda done: self._on_done(request_id, done))
        self._send({"op": "run", "id": request_id, "kind": kind, "purpose": purpose,
                    "timeout_s": timeout_s, **payload})
        return future

    def _on_done(self, request_id: int, future: Future) -> None:
        if future.cancelled():
            self._send({"op": "kill", "id": request_id}, quiet=True)

    def _send(self, message: dict[str, Any], quiet: bool = False) -> None:
        data = (json.dumps(message) + "\n").encode()
        with self._lock:
            if self._request_w is None:
                if quiet:
                    return
                raise SandboxError(self._dead_reason or "the sandbox pool is closed")
            try:
                view = memoryview(data)
                while view:
                    written = os.write(self._request_w, view)
                    view = view[written:]
            except OSError as error:
                if not quiet:
                    raise SandboxError(self._dead_reason or f"the fork server is gone: {error}") from error

    def _serve(self) -> None:
        request_r, request_w = os.pipe()
        event_r, event_w = os.pipe()
        try:
            if self.start_method == "fork":
                self._process = _fork_server(self._options, request_r, event_w, self._environment)
            else:
                self._process = subprocess.Popen(
                    [sys.executable, "-m", "minify_worker.sandbox", *self._options.argv(),
                     "--request-fd", str(request_r), "--event-fd", str(event_w)],
                    pass_fds=(request_r, event_w), env=self._environment,
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, cwd=str(self.root / "tmp"),
                )
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
        _resolve(pending.future, result=outcome_of_child(event, pending.timeout_s))
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


# ---------------------------------------------------------------------------------------------
# Fork server side
# ---------------------------------------------------------------------------------------------


@dataclass
class _Child:
    request: dict[str, Any]
    pid: int
    started: float
    deadline: float | None
    result_path: Path
    log_path: Path
    timed_out: bool = False
    killed: bool = False
    over_memory: bool = False


@dataclass
class _Worker:
    """A long-lived child (reuse): runs candidates one at a time, requests on a pipe, acks back."""

    pid: int
    request_w: int
    ack_r: int
    ran: int = 0
    ready: bool = False
    retiring: bool = False
    buffer: bytes = b""


@dataclass
class _Server:
    root: Path
    workdir: Path
    spec: JobSpec
    parallelism: int
    threads: int
    request_fd: int
    event_fd: int
    values: dict[str, Any] = field(default_factory=dict)
    queue: deque = field(default_factory=deque)
    running: dict[int, _Child] = field(default_factory=dict)  # pid -> child
    guardian_fd: int = -1
    wake_r: int = -1
    wake_w: int = -1
    selector: selectors.BaseSelector | None = None
    deferred_warm_up: Callable[[], dict[str, Any]] | None = None
    memory_bound_mb: int | None = None
    reuse: int = 0  # candidates per long-lived child; 0: a fresh child per candidate
    workers: dict[int, _Worker] = field(default_factory=dict)  # pid -> long-lived child
    values_loaded: bool = False
    worker_error: str | None = None
    worker_failures: int = 0
    _memory_checked: float = 0.0

    # -- messages -------------------------------------------------------------------------------

    def emit(self, event: dict[str, Any]) -> None:
        data = memoryview((json.dumps(event) + "\n").encode())
        while data:
            data = data[os.write(self.event_fd, data):]

    def handle(self, message: dict[str, Any]) -> None:
        op = message.get("op")
        if op == "kill":
            self.kill_request(message["id"])
        elif op == "timeout":
            self.set_timeout(message["id"], message.get("timeout_s"))
        elif op == "run" and message.get("kind") == "load_values":
            self.emit({"event": "done", "id": message["id"], "result": self.load_values(message["path"])})
        elif op == "run":
            self.queue.append(message)

    def load_values(self, path: str) -> dict[str, Any]:
        import torch

        try:
            self.values = torch.load(path, mmap=True, weights_only=True)
        except Exception as error:
            return {"ok": False, "error": f"cannot load the value store {path}: {type(error).__name__}: {error}"}
        self.values_loaded = True
        for worker in list(self.workers.values()):  # they hold the old values: replaced as they go
            self.retire(worker)
        return {"ok": True, "value": {"names": len(self.values)}}

    def set_timeout(self, request_id: int, timeout_s: float | None) -> None:
        for message in self.queue:
            if message["id"] == request_id:
                message["timeout_s"] = timeout_s
                return
        for child in self.running.values():
            if child.request["id"] == request_id:
                child.request["timeout_s"] = timeout_s
                child.deadline = child.started + float(timeout_s) if timeout_s else None
                return

    def kill_request(self, request_id: int) -> None:
        for message in list(self.queue):
            if message["id"] == request_id:
                self.queue.remove(message)
                self.emit({"event": "done", "id": request_id, "killed": True, "result": None})
                return
        for child in self.running.values():
            if child.request["id"] == request_id:
                child.killed = True
                _kill_group(child.pid)

    # -- children -------------------------------------------------------------------------------

    def start_queued(self) -> None:
        if self.reuse and self.values_loaded:
            self.keep_workers()
        for request in list(self.queue):
            if len(self.running) >= self.parallelism:
                return
            if request["kind"] == "candidate" and self.reuse and self.values_loaded:
                worker = self.idle_worker(fresh=bool(request.get("fresh")))
                if worker is None:
                    if self.worker_failures >= MAX_WORKER_START_FAILURES:
                        self.queue.remove(request)
                        self.emit({"event": "done", "id": request["id"], "result": {
                            "sandbox_error": f"sandbox children cannot start: {self.worker_error}"}})
                    continue
                self.queue.remove(request)
                self.dispatch(worker, request)
            else:
                self.queue.remove(request)
                self.fork(request)

    def fork(self, request: dict[str, Any]) -> None:
        request_id = request["id"]
        result_path = self.root / "results" / f"{request_id}.json"
        log_path = self.root / "logs" / f"{request_id}.log"
        server_pid = os.getpid()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 70
            try:
                self.child_main(request, server_pid, result_path, log_path)
                code = 0
            finally:
                os._exit(code)
        self.track(request, pid, result_path, log_path)

    def track(self, request: dict[str, Any], pid: int, result_path: Path, log_path: Path) -> None:
        """`pid` runs `request` from now on: its deadline starts, the pool hears of it."""
        now = time.monotonic()
        timeout = request.get("timeout_s")
        deadline = now + float(timeout) if timeout else None
        self.running[pid] = _Child(request, pid, now, deadline, result_path, log_path)
        if pid not in self.workers:
            self.tell_guardian(f"+{pid}")
        self.emit({"event": "started", "id": request["id"], "pid": pid})

    def enter_child(self, server_pid: int, log_path: Path) -> None:
        """What every child does first: its own session and process group, death with the server,
        default signal handlers, none of the server's descriptors, output to its log."""
        os.setsid()
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != server_pid:
            os._exit(1)
        signal.set_wakeup_fd(-1)
        for number in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGPIPE):
            signal.signal(number, signal.SIG_DFL)
        if self.selector is not None:
            self.selector.close()
        for fd in (self.request_fd, self.event_fd, self.wake_r, self.wake_w, self.guardian_fd,
                   *(fd for worker in self.workers.values() for fd in (worker.request_w, worker.ack_r))):
            if fd >= 0:
                os.close(fd)
        _redirect_output(log_path)

    def child_main(self, request: dict[str, Any], server_pid: int, result_path: Path, log_path: Path) -> None:
        self.enter_child(server_pid, log_path)
        try:
            _confine_child(self.root / "tmp" / str(request["id"]), self.spec)
            import torch

            torch.set_num_threads(self.threads)
        except BaseException as error:  # the sandbox cannot run anything here: not a candidate's doing
            _write_result(result_path, {"sandbox_error": f"the sandbox child could not start: "
                                                         f"{type(error).__name__}: {error}",
                                        "traceback": traceback.format_exc()})
            return
        self.run_to_file(request, result_path)

    def run_to_file(self, request: dict[str, Any], result_path: Path) -> dict[str, Any]:
        result_path.with_suffix(".started").touch()
        try:
            result = self.run_request(request)
        except BaseException as error:
            result = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
        _write_result(result_path, result)
        sys.stdout.flush()
        sys.stderr.flush()
        return result

    # -- long-lived children (reuse) ------------------------------------------------------------

    def keep_workers(self) -> None:
        """`parallelism` long-lived children, started ahead of need; one more, fresh, while a
        request waits for a fresh child (a failure seen in a child that ran candidates before is
        confirmed in one that ran none)."""
        wanted = self.parallelism
        fresh_wanted = any(request.get("fresh") for request in self.queue if request["kind"] == "candidate")
        if fresh_wanted and not any(worker.ran == 0 for worker in self.workers.values()):
            if len(self.workers) > self.parallelism:
                idle = next((w for w in self.workers.values() if w.ready and w.pid not in self.running), None)
                if idle is not None:
                    self.retire(idle)
            wanted = len(self.workers) + 1
        if self.worker_failures >= MAX_WORKER_START_FAILURES:
            return
        while len(self.workers) < min(wanted, self.parallelism + 1):
            self.start_worker()

    def idle_worker(self, fresh: bool) -> _Worker | None:
        for worker in self.workers.values():
            if worker.ready and not worker.retiring and worker.pid not in self.running and \
                    (not fresh or worker.ran == 0):
                return worker
        return None

    def start_worker(self) -> None:
        request_r, request_w = os.pipe()
        ack_r, ack_w = os.pipe()
        server_pid = os.getpid()
        pid = os.fork()
        if pid == 0:  # the long-lived child: never returns
            code = 70
            try:
                os.close(request_w)
                os.close(ack_r)
                self.worker_main(request_r, ack_w, server_pid)
                code = 0
            finally:
                os._exit(code)
        os.close(request_r)
        os.close(ack_w)
        os.set_blocking(ack_r, False)
        worker = _Worker(pid, request_w, ack_r)
        self.workers[pid] = worker
        assert self.selector is not None
        self.selector.register(ack_r, selectors.EVENT_READ, worker)
        self.tell_guardian(f"+{pid}")

    def worker_main(self, request_r: int, ack_w: int, server_pid: int) -> None:
        """A long-lived child: set up the device once, then run candidates one at a time until it
        is told to stop, or retires itself (`_should_retire`)."""
        pid = os.getpid()
        self.enter_child(server_pid, self.root / "logs" / f"worker-{pid}.log")
        try:
            _confine_child(self.root / "tmp" / f"worker-{pid}", self.spec)
            import torch

            torch.set_num_threads(self.threads)
            warm_up_device(self.spec)
        except BaseException as error:
            _write_line(ack_w, {"event": "failed", "error": f"{type(error).__name__}: {error}"})
            return
        _write_line(ack_w, {"event": "ready"})
        baseline_mb = _own_resident_mb()
        ran = 0
        with os.fdopen(request_r, "rb") as requests:
            for line in requests:
                request = json.loads(line)
                _redirect_output(self.root / "logs" / f"{request['id']}.log")
                result = self.run_to_file(request, self.root / "results" / f"{request['id']}.json")
                ran += 1
                retire = ran >= self.reuse or _should_retire(result, _own_resident_mb() - baseline_mb)
                if not retire:
                    _drop_compile_state(self.spec)
                _write_line(ack_w, {"event": "done", "id": request["id"], "retire": retire})
                if retire:
                    return

    def dispatch(self, worker: _Worker, request: dict[str, Any]) -> None:
        data = (json.dumps(request) + "\n").encode()
        try:
            _write_all(worker.request_w, data)
        except OSError:  # it died a moment ago: reap() replaces it
            self.queue.appendleft(request)
            return
        self.track(request, worker.pid, self.root / "results" / f"{request['id']}.json",
                   self.root / "logs" / f"{request['id']}.log")

    def worker_events(self, worker: _Worker) -> None:
        try:
            chunk = os.read(worker.ack_r, 1 << 16)
        except BlockingIOError:
            return
        if not chunk:
            self.forget_worker(worker)
            return
        worker.buffer += chunk
        *lines, worker.buffer = worker.buffer.split(b"\n")
        for line in lines:
            if line.strip():
                self.worker_event(worker, json.loads(line))

    def worker_event(self, worker: _Worker, event: dict[str, Any]) -> None:
        name = event.get("event")
        if name == "ready":
            worker.ready = True
            self.worker_failures = 0
        elif name == "failed":
            self.worker_error = event.get("error")
            self.worker_failures += 1
        elif name == "done":
            child = self.running.pop(worker.pid, None)
            worker.ran += 1
            if event.get("retire"):
                self.retire(worker)
            if child is not None:
                self.finish_on_worker(worker, child)

    def finish_on_worker(self, worker: _Worker, child: _Child) -> None:
        """Report a request a long-lived child ran; a failure seen in a child that ran candidates
        before runs again in a fresh one first, so no candidate's leftover state decides another's
        outcome."""
        request = child.request
        if worker.ran > 1 and not request.get("fresh") and _is_failure(child.result_path):
            for path in (child.result_path, child.result_path.with_suffix(".started"), child.log_path):
                path.unlink(missing_ok=True)
            self.queue.appendleft({**request, "fresh": True})
            return
        self.report(child, 0)

    def retire(self, worker: _Worker) -> None:
        """Let `worker` finish: EOF on its requests; reap() forgets it when it exits."""
        if not worker.retiring:
            worker.retiring = True
            os.close(worker.request_w)
            worker.request_w = -1

    def forget_worker(self, worker: _Worker) -> None:
        if worker.ack_r >= 0:
            assert self.selector is not None
            self.selector.unregister(worker.ack_r)
            os.close(worker.ack_r)
            worker.ack_r = -1
        if worker.request_w >= 0:
            os.close(worker.request_w)
            worker.request_w = -1

    def run_request(self, request: dict[str, Any]) -> dict[str, Any]:
        from .runner import EnvironmentFault, environment_fault

        if request["kind"] == "candidate":
            from .runner import run_wire_candidate

            try:
                outcome = run_wire_candidate(request["graph"], self.values, self.spec, self.root / "tmp")
            except EnvironmentFault as fault:
                return {"sandbox_error": str(fault)}
            return {"outcome": outcome_to_dict(outcome)}
        module_name, _, name = request["target"].partition(":")
        try:
            if not module_name.startswith(CALL_PREFIX):
                raise ValueError(f"call target {request['target']!r} is not in minify_worker")
            function = getattr(importlib.import_module(module_name), name)
            value = function(ChildContext(self.workdir, self.spec, self.values), **request["kwargs"])
            json.dumps(value)
        except Exception as error:
            fault = environment_fault(error)
            if fault is not None:
                return {"sandbox_error": fault}
            return {"ok": False, "error_type": type(error).__name__, "error": f"{type(error).__name__}: {error}",
                    "traceback": traceback.format_exc()}
        return {"ok": True, "value": value}

    def reap(self) -> None:
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid == 0:
                return
            pid = info.si_pid
            child = self.running.pop(pid, None)
            worker = self.workers.pop(pid, None)
            if worker is not None:
                self.forget_worker(worker)
                if child is None:
                    self.tell_guardian(f"-{pid}")
            if child is not None:
                # The zombie still holds its pid: the group id cannot have been reused yet.
                _kill_group(pid)
            _, status = os.waitpid(pid, 0)
            if child is not None:
                self.tell_guardian(f"-{pid}")
                self.report(child, status)

    def tell_guardian(self, line: str) -> None:
        if self.guardian_fd >= 0:
            try:
                os.write(self.guardian_fd, f"{line}\n".encode())
            except OSError:
                log.warning("sandbox: the guardian is gone; children may outlive a killed server")
                self.guardian_fd = -1

    def report(self, child: _Child, status: int) -> None:
        result = None
        if child.result_path.exists():
            try:
                result = json.loads(child.result_path.read_text())
            except ValueError:
                result = None
        started = child.result_path.with_suffix(".started")
        event: dict[str, Any] = {
            "event": "done", "id": child.request["id"], "pid": child.pid, "result": result,
            "timed_out": child.timed_out, "killed": child.killed or child.timed_out or child.over_memory,
            "over_memory": child.over_memory, "memory_bound_mb": self.memory_bound_mb,
            "wall_s": round(time.monotonic() - child.started, 4),
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            # A child that ended before it reached its request, unasked, died in the sandbox's set-up.
            "setup_failed": result is None and not started.exists()
            and not (child.killed or child.timed_out or child.over_memory),
        }
        if result is None or "error" in result or "sandbox_error" in result:
            event["log_tail"] = _tail(child.log_path)
        for path in (child.result_path, child.result_path.with_suffix(".tmp"), started, child.log_path):
            path.unlink(missing_ok=True)
        shutil.rmtree(self.root / "tmp" / str(child.request["id"]), ignore_errors=True)
        self.emit(event)

    def enforce_deadlines(self) -> None:
        now = time.monotonic()
        for child in self.running.values():
            if child.deadline is not None and now >= child.deadline and not child.timed_out:
                child.timed_out = True
                _kill_group(child.pid)
        if self.memory_bound_mb and self.running and now - self._memory_checked >= MEMORY_CHECK_INTERVAL_S:
            self._memory_checked = now
            resident = _resident_mb_by_group(set(self.running))
            for child in self.running.values():
                if not child.over_memory and resident.get(child.pid, 0.0) > self.memory_bound_mb:
                    child.over_memory = True
                    _kill_group(child.pid)

    def next_wakeup(self) -> float | None:
        deadlines = [c.deadline for c in self.running.values() if c.deadline is not None and not c.timed_out]
        if self.memory_bound_mb and self.running:
            deadlines.append(time.monotonic() + MEMORY_CHECK_INTERVAL_S)
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - time.monotonic())

    # -- loop -----------------------------------------------------------------------------------

    def serve(self) -> None:
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.request_fd, selectors.EVENT_READ, "requests")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        buffer = b""
        listened = False
        while True:
            self.start_queued()
            if self.deferred_warm_up is not None and listened:
                # After the first requests are forked (prepare needs no warm-up), before any later one.
                warm, self.deferred_warm_up = self.deferred_warm_up, None
                self.emit({"event": "warm", **warm()})
            listened = True
            wait = 0.2 if self.deferred_warm_up is not None else self.next_wakeup()
            for key, _ in self.selector.select(wait):
                if key.data == "wake":
                    _drain(self.wake_r)
                    continue
                if isinstance(key.data, _Worker):
                    self.worker_events(key.data)
                    continue
                chunk = os.read(self.request_fd, 1 << 20)
                if not chunk:
                    return
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        self.handle(json.loads(line))
            self.reap()
            self.enforce_deadlines()

    def shutdown(self) -> None:
        self.queue.clear()
        pids = set(self.running) | set(self.workers)
        for pid in pids:
            _kill_group(pid)
        for pid in pids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        self.running.clear()
        _kill_adopted_descendants()


def _start_guardian() -> int:
    """Fork the guardian; returns the pipe it reads "+pid"/"-pid" lines from. When the pipe closes
    (the server exited or was killed), it kills the process group of every pid still registered."""
    read_fd, write_fd = os.pipe()
    if os.fork() == 0:
        try:
            os.close(write_fd)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            groups: set[int] = set()
            buffer = b""
            while chunk := os.read(read_fd, 4096):
                *lines, buffer = (buffer + chunk).split(b"\n")
                for line in lines:
                    if line.startswith(b"+"):
                        groups.add(int(line[1:]))
                    elif line.startswith(b"-"):
                        groups.discard(int(line[1:]))
            for pid in groups:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
        finally:
            os._exit(0)
    os.close(read_fd)
    return write_fd


def _resident_mb_by_group(groups: set[int]) -> dict[int, float]:
    """Resident memory (MiB) of each process group in `groups`: a child and all it started."""
    page_mb = os.sysconf("SC_PAGE_SIZE") / (1 << 20)
    totals: dict[int, float] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[-1].split()
        except OSError:
            continue
        group = int(fields[2])
        if group in groups:
            totals[group] = totals.get(group, 0.0) + int(fields[21]) * page_mb
    return totals


def machine_memory_mb() -> int:
    """The machine's memory (MiB), or its cgroup's limit when that is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        return total
    return min(total, int(limit) // (1 << 20)) if limit.isdigit() else total


def default_memory_bound_mb(parallelism: int) -> int:
    """Each candidate's share of the machine: 80 % of its memory over the children at once."""
    return max(512, int(machine_memory_mb() * 0.8 / max(1, parallelism)))


# What a child inherits of the worker's environment is scrubbed of these: the sandbox runs code the
# program brings (a custom backend, pickles the operator allowed), and it has no use for secrets.
_SECRET_NAME = re.compile(
    r"(TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|PRIVATE|API_?KEY|ACCESS_?KEY|AUTH)|"
    r"^(AWS_|AZURE_|GOOGLE_|GCP_|GCLOUD_|CLOUDSDK_|REDIS|RQ_|MINIFY_REDIS|DATABASE_URL|SENTRY_DSN)"
)


def scrubbed_environment(environment: dict[str, str]) -> dict[str, str]:
    """`environment` without what a sandbox child must not see: tokens, passwords, cloud credentials,
    the Redis URL (it may carry a password)."""
    return {name: value for name, value in environment.items() if not _SECRET_NAME.search(name.upper())}


def _confine_child(tmp: Path, spec: JobSpec) -> None:
    """A child's own temp dir and resource limits: no core dumps, a bounded number of open files,
    and on CPU jobs a bound on address space (CUDA maps far more address space than it uses, so
    cuda jobs rely on the server's resident-memory watch alone)."""
    tmp.mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = str(tmp)
    tempfile.tempdir = None
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = CHILD_OPEN_FILES if hard == resource.RLIM_INFINITY else min(CHILD_OPEN_FILES, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    bound = os.environ.get(_ADDRESS_SPACE_ENV)
    if bound and spec.device_class == "cpu":
        limit = int(bound) << 20
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard == resource.RLIM_INFINITY or limit < hard:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit if hard == resource.RLIM_INFINITY else hard))


def _redirect_output(log_path: Path) -> None:
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)


def _write_result(result_path: Path, result: dict[str, Any]) -> None:
    temporary = result_path.with_suffix(".tmp")
    temporary.write_text(json.dumps(result))
    os.replace(temporary, result_path)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _write_line(fd: int, message: dict[str, Any]) -> None:
    _write_all(fd, (json.dumps(message) + "\n").encode())


def _own_resident_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


# Signs that a process cannot be trusted with another candidate: CUDA's context is unusable after
# an error (illegal memory access, device-side assert, ...), and a sandbox error is the process's own.
_UNUSABLE_AFTER = re.compile(r"CUDA error|device-side assert|illegal memory access|CUBLAS_STATUS|"
                             r"CUDNN_STATUS|an illegal instruction|unspecified launch failure")


def _should_retire(result: dict[str, Any], growth_mb: float) -> bool:
    """Whether a long-lived child retires after this result: its process may not be fit to run another."""
    if "sandbox_error" in result or "error" in result or growth_mb > REUSE_MEMORY_GROWTH_MB:
        return True
    outcome = result.get("outcome") or {}
    if outcome.get("kind") in ("crashed", "oom", "timed_out"):
        return True
    text = json.dumps(outcome.get("signature") or {})
    return _UNUSABLE_AFTER.search(text) is not None


def _is_failure(result_path: Path) -> bool:
    """Whether the candidate result written at `result_path` counts as some failure."""
    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError):
        return False
    return (result.get("outcome") or {}).get("kind") in ("fails", "crashed", "oom", "timed_out")


def _drop_compile_state(spec: JobSpec) -> None:
    """Between two candidates in one process: forget what dynamo and inductor keep in memory (their
    on-disk caches stay, shared by all children) and give cached device memory back."""
    import gc

    import torch

    torch._dynamo.reset()
    try:
        from torch._inductor.codecache import PyCodeCache

        PyCodeCache.cache_clear(purge=False)
    except (ImportError, AttributeError, TypeError):
        pass
    gc.collect()
    if spec.device_class == "cuda":
        torch.cuda.empty_cache()


def warm_up_device(spec: JobSpec) -> None:
    """A long-lived child's set-up, once: the CUDA context and a first compile on the job's device,
    so its first candidate does not pay for them. On the CPU a forked child inherits the server's."""
    if spec.device_class != "cuda":
        return
    import torch

    device = torch.device(spec.device)
    torch.cuda.set_device(device)
    torch.empty(1, device=device)
    if spec.backend in ("inductor", "aot_inductor"):
        _compile_warm_up_graph(device)


def default_reuse(spec: JobSpec) -> int:
    """Candidates per long-lived child: `MINIFY_SANDBOX_REUSE` if set (0: a fresh child per
    candidate), else per device: on CUDA a fresh child pays its context and a cold first compile
    (seconds) every time, so children are reused; on the CPU, children forked from the warm server
    start warm anyway (docs/bench.md)."""
    configured = os.environ.get("MINIFY_SANDBOX_REUSE", "").strip()
    if configured:
        return max(0, int(configured))
    return DEFAULT_REUSE_CUDA if spec.device_class == "cuda" else 0


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        # Not yet a group leader (killed before its setsid): it has started nothing yet.
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _kill_adopted_descendants() -> None:
    """Kill and reap processes re-parented to this subreaper that escaped their group (setsid)."""
    me = str(os.getpid())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[-1].split()[1] == me:
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                os.waitpid(int(entry.name), 0)
            except (ProcessLookupError, ChildProcessError):
                pass


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - _LOG_TAIL))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def warm_up(spec: JobSpec) -> dict[str, Any]:
    """Import what every candidate child needs, without initializing CUDA or starting OpenMP threads.

    For inductor on the CPU it also runs `_warm_inductor_cpu`, whose results every forked child
    inherits. The server runs this right after forking its first child (prepare, which needs none
    of it), so the two overlap; a server forked from a warm `preload()`ed origin skips it.
    """
    started = time.monotonic()
    _import_compiler_modules()
    import torch

    imported = time.monotonic()
    if spec.backend in ("inductor", "aot_inductor") and spec.device_class == "cpu":
        _warm_inductor_cpu()
    return {"imports_s": round(imported - started, 3), "warmup_s": round(time.monotonic() - started, 3),
            "cuda_initialized": bool(torch.cuda.is_initialized())}


def gpu_present() -> bool:
    """Whether this machine has a CUDA device, asked without initializing CUDA in this process.

    With `PYTORCH_NVML_BASED_CUDA_CHECK=1` (set by importing `minify_worker`) torch asks NVML;
    without it, `torch.cuda.is_available()` would initialize CUDA and poison every later fork, so
    the driver's files are looked at instead.
    """
    import torch

    if os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") == "1":
        return bool(torch.cuda.is_available())
    return Path("/proc/driver/nvidia").exists() or any(Path("/dev").glob("nvidia[0-9]*"))


def _warm_inductor_cpu() -> None:
    """Inductor's vector-ISA probe (a few small C++ builds, each checked by a `python -c` dlopen
    subprocess; cached in this process) and a compile-only warm-up (`_compile_warm_up_graph`).

    On a machine with a GPU the compile is skipped: aot_autograd saves the CUDA RNG state around
    every compile (`preserve_rng_state` -> `torch.cuda.get_rng_state`), which initializes CUDA in
    this process and makes CUDA unusable in every child forked from it, CPU jobs' included.
    """
    import torch._inductor.codecache
    import torch._inductor.config as inductor_config
    import torch._inductor.cpu_vec_isa as cpu_vec_isa

    inductor_config.compile_threads = 1
    if hasattr(torch._inductor.codecache, "_HEADER_DIR"):
        # Precompiled headers go under the temp dir by default, which is per job: keep them with the caches.
        torch._inductor.codecache._HEADER_DIR = os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"],
                                                             "precompiled_headers")
    cpu_vec_isa.pick_vec_isa()
    if gpu_present():
        log.info("sandbox: a GPU is present: no warm-up compile in a process that forks candidates")
        return
    _compile_warm_up_graph()


def _import_compiler_modules() -> None:
    """What every candidate child imports: torch, dynamo, inductor's compiler, export, our runner."""
    import torch
    import torch._dynamo
    import torch._inductor.codecache
    import torch._inductor.compile_fx
    import torch._inductor.cpu_vec_isa
    import torch.export  # noqa: F401

    from . import backends, runner  # noqa: F401


def _compile_warm_up_graph(device: Any = "cpu") -> None:
    """Compile (never run) a tiny graph, so children inherit inductor's lazily built state.

    Measured here: a candidate's first compile in a fresh child goes from about 2.1 s to 1.2 s.
    It runs no kernel (no OpenMP pool) and starts no thread (compile_threads=1); every child
    starts from the same state, so it cannot make one candidate's outcome depend on another.
    """
    import torch
    from torch._inductor.compile_fx import compile_fx

    def warm_up_graph(x: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.sin(x) + 1,)

    try:
        with torch.no_grad():
            compile_fx(torch.fx.symbolic_trace(warm_up_graph), [torch.empty(4, 4, device=device)])
    except Exception:  # a warm-up is an optimization: a broken one must not stop the job
        log.warning("inductor warm-up compile failed", exc_info=True)


def _server_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="minify fork server (started by SandboxPool)")
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--parallelism", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--values", type=Path)
    parser.add_argument("--no-warm", action="store_true")
    parser.add_argument("--memory-mb", type=int)
    parser.add_argument("--reuse", type=int, default=0)
    parser.add_argument("--request-fd", type=int, required=True)
    parser.add_argument("--event-fd", type=int, required=True)
    args = parser.parse_args(argv)
    options = _ServerOptions(root=args.root, workdir=args.workdir, spec_json=args.spec, parallelism=args.parallelism,
                             threads=args.threads, parent_pid=args.parent_pid, values=args.values,
                             warm=not args.no_warm, memory_mb=args.memory_mb, reuse=args.reuse)
    return _run_server(options, args.request_fd, args.event_fd)


def _run_server(options: _ServerOptions, request_fd: int, event_fd: int) -> int:
    """The fork server's life, spawned (`python -m minify_worker.sandbox`) or forked from a preloaded parent."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != options.parent_pid:
        return 1
    guardian_fd = _start_guardian()
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server = _Server(options.root, options.workdir, JobSpec.model_validate_json(options.spec_json),
                     options.parallelism, options.threads, request_fd, event_fd, guardian_fd=guardian_fd,
                     memory_bound_mb=options.memory_mb, reuse=options.reuse)
    try:
        started = time.monotonic()
        import torch  # every child needs it
        import torch._inductor.config as inductor_config

        # One compile thread per child (children run side by side instead). Inductor keeps config
        # overrides per thread context, so a server forked from another thread than the one that
        # preloaded would not see preload()'s: set it here, in the context every child inherits.
        inductor_config.compile_threads = 1
        info: dict[str, Any] = {"imports_s": round(time.monotonic() - started, 3), "warmup_s": 0.0,
                                "cuda_initialized": bool(torch.cuda.is_initialized())}
        if options.warm and not _fork_origin_warm:
            server.deferred_warm_up = lambda: warm_up(server.spec)
        if options.values is not None:
            loaded = server.load_values(str(options.values))
            if not loaded["ok"]:
                server.emit({"event": "fatal", "message": loaded["error"]})
                return 2
        server.emit({"event": "ready", "pid": os.getpid(), **info})
        server.serve()
    except BrokenPipeError:
        pass
    finally:
        server.shutdown()
    return 0


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
                    should_stop: Callable[[], str | None] | None = None) -> PreparedProgram:
    """Run the loader in a sandbox child: values.pt and program.json into `workdir`.

    Uses `pool` if given (it need not have a value store yet), else a one-shot pool without
    inductor warm-up. Any failure (a bad file, inputs that do not fit, a crash or hang while
    loading) raises `ProgramError` with a message for the user. When `should_stop` answers a
    reason (a cancel, a job deadline), the loading child is killed and `PrepareStopped` raised.
    """
    own_pool = pool is None
    active = pool or SandboxPool(workdir, None, spec, 1, warm=False)
    kwargs = {"program": str(Path(program).resolve()),
              "inputs": None if inputs is None else str(Path(inputs).resolve())}
    try:
        future = active.submit_call("minify_worker.loader:prepare_in_child", kwargs, timeout_s, purpose="prepare")
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


if __name__ == "__main__":
    code = _server_main()
    sys.stderr.flush()
    os._exit(code)  # skip torch's and inductor's exit handlers: nothing of theirs needs to run here
