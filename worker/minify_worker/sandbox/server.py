"""The fork server: its options and entry points (spawned as `python -m minify_worker.sandbox`,
or forked from a preloaded parent), and its loop (`_Server`): requests from the pool, one forked
child per request or a long-lived child per slot (reuse), deadlines, the memory watch, reaping,
and a report to the pool of how each child ended."""

from __future__ import annotations

import argparse
import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minify_contract import zero_tensors
from minify_contract.models import JobSpec

from .. import programs
from ..programs.prepared import ProgramError
from .child import ChildSetup, run_child, run_long_lived_child
from .processes import (
    PR_SET_CHILD_SUBREAPER,
    PR_SET_PDEATHSIG,
    ForkedProcess,
    drain,
    fork_detached,
    kill_adopted_descendants,
    kill_group,
    prctl,
    resident_mb_by_group,
    start_guardian,
    write_all,
    write_line,
)
from .warmup import origin_warmed_up, warm_up

log = logging.getLogger(__name__)

_LOG_TAIL = 4000
MEMORY_CHECK_INTERVAL_S = 0.2
# How many long-lived children may fail to start in a row before candidates fail with the reason.
MAX_WORKER_START_FAILURES = 2


@dataclass(frozen=True)
class ServerOptions:
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


def server_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minify_worker.sandbox",
                                     description="minify fork server (started by SandboxPool)")
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
    options = ServerOptions(root=args.root, workdir=args.workdir, spec_json=args.spec, parallelism=args.parallelism,
                             threads=args.threads, parent_pid=args.parent_pid, values=args.values,
                             warm=not args.no_warm, memory_mb=args.memory_mb, reuse=args.reuse)
    return run_server(options, args.request_fd, args.event_fd)


def run_server(options: ServerOptions, request_fd: int, event_fd: int) -> int:
    """The fork server's life, spawned (`python -m minify_worker.sandbox`) or forked from a preloaded parent."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != options.parent_pid:
        return 1
    guardian_fd = start_guardian()
    prctl(PR_SET_CHILD_SUBREAPER, 1)
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
        representation = programs.of_format(server.spec.program_format)
        try:  # before anything is forked: what every child needs (FX: the program's custom ops registered)
            representation.set_up_children(server.spec)
        except ProgramError as error:
            server.emit({"event": "fatal", "message": str(error)})
            return 2
        info: dict[str, Any] = {"imports_s": round(time.monotonic() - started, 3), "warmup_s": 0.0,
                                "cuda_initialized": bool(torch.cuda.is_initialized())}
        if options.warm and not origin_warmed_up():
            server.deferred_warm_up = lambda: warm_up(server.spec)
        elif not representation.preloaded:  # a warm origin imported only the preloaded: once here, not per child
            programs.import_modules(representation.child_modules)
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


def start_server(options: ServerOptions, request_fd: int, event_fd: int, environment: dict[str, str],
                 method: str) -> subprocess.Popen | ForkedProcess:
    """Start the fork server with the ends of its two pipes: `method` "fork" forks it from this
    (preloaded) process, "spawn" runs `python -m minify_worker.sandbox`."""
    if method == "fork":
        return fork_detached(lambda: run_server(options, request_fd, event_fd), keep={request_fd, event_fd},
                             environment=environment, cwd=options.root / "tmp")
    return subprocess.Popen(
        [sys.executable, "-m", "minify_worker.sandbox", *options.argv(),
         "--request-fd", str(request_fd), "--event-fd", str(event_fd)],
        pass_fds=(request_fd, event_fd), env=environment,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, cwd=str(options.root / "tmp"),
    )


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
        write_line(self.event_fd, event)

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
            # A ZeroTensor (no storage: torch.save cannot write it) is stored as a marker.
            self.values = zero_tensors.decode(torch.load(path, mmap=True, weights_only=True))
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
                kill_group(child.pid)

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
        setup = self.child_setup()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 70
            try:
                run_child(setup, request, result_path, log_path)
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

    def child_setup(self) -> ChildSetup:
        """What a child forked now takes along (see `child.py`)."""
        descriptors = (self.request_fd, self.event_fd, self.wake_r, self.wake_w, self.guardian_fd,
                       *(fd for worker in self.workers.values() for fd in (worker.request_w, worker.ack_r)))
        return ChildSetup(root=self.root, workdir=self.workdir, spec=self.spec, threads=self.threads,
                          values=self.values, reuse=self.reuse, server_pid=os.getpid(),
                          server_descriptors=[fd for fd in descriptors if fd >= 0], selector=self.selector)

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
        setup = self.child_setup()
        pid = os.fork()
        if pid == 0:  # the long-lived child: never returns
            code = 70
            try:
                os.close(request_w)
                os.close(ack_r)
                run_long_lived_child(setup, request_r, ack_w)
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

    def dispatch(self, worker: _Worker, request: dict[str, Any]) -> None:
        data = (json.dumps(request) + "\n").encode()
        try:
            write_all(worker.request_w, data)
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
        if worker.ran > 1 and not child.request.get("fresh") and _is_failure(child.result_path):
            self.requeue_fresh(child)
            return
        self.report(child, 0)

    def requeue_fresh(self, child: _Child) -> None:
        """Run `child`'s request again, first in the queue, in a child that ran nothing before."""
        for path in (child.result_path, child.result_path.with_suffix(".started"), child.log_path):
            path.unlink(missing_ok=True)
        self.queue.appendleft({**child.request, "fresh": True})

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
                kill_group(pid)
            _, status = os.waitpid(pid, 0)
            if child is not None:
                self.tell_guardian(f"-{pid}")
                if worker is not None and worker.ran > 0 and self.died_of_its_own(child, status):
                    # A long-lived child that ran candidates before died on this one: it runs
                    # again in a fresh child before its death counts (an earlier candidate's
                    # leftover state may have killed it).
                    self.requeue_fresh(child)
                    continue
                self.report(child, status)

    def died_of_its_own(self, child: _Child, status: int) -> bool:
        """Whether `child` died unasked (a signal or an exit, not our timeout, cancel or memory kill)
        before it wrote its result."""
        asked = child.timed_out or child.killed or child.over_memory
        return not asked and not child.request.get("fresh") and not child.result_path.exists() \
            and (os.WIFSIGNALED(status) or os.WIFEXITED(status))

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
        if result is None or "error" in result or "sandbox_error" in result or child.request.get("output"):
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
                kill_group(child.pid)
        if self.memory_bound_mb and self.running and now - self._memory_checked >= MEMORY_CHECK_INTERVAL_S:
            self._memory_checked = now
            resident = resident_mb_by_group(set(self.running))
            for child in self.running.values():
                if not child.over_memory and resident.get(child.pid, 0.0) > self.memory_bound_mb:
                    child.over_memory = True
                    kill_group(child.pid)

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
                    drain(self.wake_r)
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
            kill_group(pid)
        for pid in pids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        self.running.clear()
        kill_adopted_descendants()


def _is_failure(result_path: Path) -> bool:
    """Whether the candidate result written at `result_path` counts as some failure."""
    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError):
        return False
    return (result.get("outcome") or {}).get("kind") in ("fails", "crashed", "oom", "timed_out")


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - _LOG_TAIL))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""
