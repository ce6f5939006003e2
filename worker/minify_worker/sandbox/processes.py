"""Process plumbing of the sandbox: prctl, forking a detached process (the fork server, from a
preloaded parent), the guardian that kills what a killed server leaves, killing a process group,
reaping what escaped it, resident memory per process group, and writing to descriptors."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


class ForkedProcess:
    """The part of `subprocess.Popen` the pool uses, for a process `fork_detached` forked (the fork server)."""

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


def fork_detached(main: Callable[[], int], *, keep: set[int], environment: dict[str, str], cwd: Path) -> ForkedProcess:
    """Fork a process that runs `main()` and exits with its code: with only stderr and the descriptors
    in `keep` of this process's, `environment` for its own, in `cwd`, with default signal handlers."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "multi-threaded, fork() may deadlock": see below
        pid = os.fork()
    if pid:
        return ForkedProcess(pid)
    # Only the forking thread lives on here. Python re-initializes the import lock, logging's
    # locks and the GIL after a fork; nothing else this child touches was held by another thread.
    code = 70
    try:
        _detach_inherited_descriptors(keep)
        os.environ.clear()
        os.environ.update(environment)
        tempfile.tempdir = None  # computed again from the new TMPDIR
        os.chdir(cwd)
        _reset_signal_handlers()
        code = main()
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


def start_guardian() -> int:
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


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        # Not yet a group leader (killed before its setsid): it has started nothing yet.
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def process_stats() -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of /proc/PID/stat after the command name) of every live process: `[0]` the
    state, `[1]` the parent, `[2]` the process group, `[3]` the session, `[21]` resident pages."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[-1].decode().split()
        except OSError:
            continue  # gone meanwhile
        yield int(entry.name), fields


def kill_adopted_descendants() -> None:
    """Kill and reap processes re-parented to this subreaper that escaped their group (setsid)."""
    me = str(os.getpid())
    for pid, fields in process_stats():
        if fields[1] == me:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


def resident_mb_by_group(groups: set[int]) -> dict[int, float]:
    """Resident memory (MiB) of each process group in `groups`: a child and all it started."""
    page_mb = os.sysconf("SC_PAGE_SIZE") / (1 << 20)
    totals: dict[int, float] = {}
    for _, fields in process_stats():
        group = int(fields[2])
        if group in groups:
            totals[group] = totals.get(group, 0.0) + int(fields[21]) * page_mb
    return totals


def own_resident_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def redirect_output(log_path: Path) -> None:
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_line(fd: int, message: dict[str, Any]) -> None:
    write_all(fd, (json.dumps(message) + "\n").encode())


def drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass
