"""Crash-safe capture (opt-in, `MINIFY_CAPTURE_CRASH=1` or the runner's `--crash`): compiled code
that kills the process (a generated kernel that segfaults, glibc aborting on a heap overrun, an
`os._exit`) still leaves its capture behind.

- Before a compiled graph's first run, the session exports it with that run's inputs into
  `DIR/.pending/<pid>-<n>/` (the capture's three files, the spec saying `failure.kind = "crash"`,
  and `pending.json` last: a folder without it is incomplete). An inductor compile on the CPU
  records its thread count (`cpp.threads`, `compile_threads`): a check that throws inside an
  OpenMP region kills the process only where the kernel has one. When the run returns or raises, the
  folder is removed. Only the first run of each graph is guarded: later runs pass straight
  through the wrapper.
- A process that dies inside that run leaves the folder. The supervisor (the runner's or the
  plugin's parent process, which started the program as its child and waited for it) turns it
  into a capture whose signature is the signal (`SIGSEGV`) or the exit status (`ExitStatus: 3`)
  it died with, the names the worker's sandbox gives the same deaths (`CaptureSession.adopt`).
  The supervisor then ends the way its child did: the same exit code, or the same signal.
- Pending folders of processes that died with no supervisor watching (a pytest-xdist worker, a
  run without the runner) are adopted by the next session that starts in DIR, with no signature
  (the job takes the one its original run dies with).

A hang (opt-in, `MINIFY_CAPTURE_HANG=SECONDS` or the runner's `--hang SECONDS`): each graph is also
written as a pending capture before dynamo hands it to the backend (`phase` "compile"; the first
run's guard as above follows). The supervisor watches the pending folders of every process
writing into DIR (an xdist worker's too): one whose compile or first run has lasted past SECONDS
is stopped, its Python stack first dumped to its stderr (faulthandler, SIGUSR2), then killed, and
its folder, marked `stopped.json`, becomes a capture of `failure.kind = "timeout"` (`hung`). A
program the supervisor itself stopped ends with 124, as `timeout(1)` does.

The parent imports no torch: it runs the program, waits, and moves files.
"""

from __future__ import annotations

import faulthandler
import hashlib
import itertools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minify_contract import zero_tensors

from .program_file import write_program

logger = logging.getLogger(__name__)

CRASH_ENV = "MINIFY_CAPTURE_CRASH"
# Set in the program a supervisor runs: the program itself runs in-process and guards first runs.
SUPERVISED_ENV = "MINIFY_CAPTURE_SUPERVISED"
PENDING = ".pending"
_META = "pending.json"
_counter = itertools.count()
_dumps_stack = False  # this process dumps its stack on SIGUSR2 (`dump_stack_on_request`)


HANG_ENV = "MINIFY_CAPTURE_HANG"
_STOPPED = "stopped.json"  # in a pending folder: the supervisor stopped its process as a hang
# How often a supervisor watching for hangs looks at the pending folders, and how long a stopped
# process has to dump its stack before it is killed.
_WATCH_S = 0.5
_DUMP_S = 1.0
HUNG_EXIT = 124  # a supervised program stopped as a hang ends like this, as timeout(1) does
MAX_HANG_S = 7 * 24 * 3600


def requested() -> bool:
    return os.environ.get(CRASH_ENV) == "1"


class BadHangLimit(ValueError):
    """MINIFY_CAPTURE_HANG holds no usable number of seconds."""


def hang_limit() -> float | None:
    """MINIFY_CAPTURE_HANG's seconds: a compile or first run that lasts longer is stopped and
    captured as a hang (None: unset)."""
    raw = os.environ.get(HANG_ENV, "").strip()
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        raise BadHangLimit(f"{HANG_ENV}={raw!r}: give the seconds a compile may take before it counts as a "
                           "hang, e.g. 600") from None
    if not 0 < seconds <= MAX_HANG_S:
        raise BadHangLimit(f"{HANG_ENV}={raw!r}: the seconds must be more than 0 and at most {MAX_HANG_S}")
    return seconds


def supervision_requested() -> bool:
    """A crash-safe or hang-watching capture: the program runs as a supervised child."""
    return requested() or hang_limit() is not None


def supervised() -> bool:
    return bool(os.environ.get(SUPERVISED_ENV))


class CompiledCodeDied(Exception):
    """Stands for the failure while a pending capture is written: the process has not died yet."""


class CompileHung(Exception):
    """Stands for the failure while a compile's pending capture is written: it has not hung yet."""


def watch_compiled(compiled: Callable[..., Any], listeners: Sequence[Any],
                   describe: Callable[[Sequence[Any]], Any]) -> Callable[..., Any]:
    """What torch_hooks' dynamo hook returns for a graph that compiled: `compiled` itself, or, when
    a listener guards first runs (`guards_first_runs`: crash or hang set), a wrapper that calls `before_first_run` (with
    `describe(args)`: the FailedCompile of that run) and `after_first_run` around the first call.
    Every listener with `on_compiled` hears that a graph compiled."""
    for listener in listeners:
        if hasattr(listener, "on_compiled"):
            listener.on_compiled()
    guards = [listener for listener in listeners if getattr(listener, "guards_first_runs", False)]
    if not guards:
        return compiled
    lock = threading.Lock()
    first = [True]

    def run(*args: Any, **kwargs: Any) -> Any:
        if not first[0]:
            return compiled(*args, **kwargs)
        with lock:
            mine, first[0] = first[0], False
        if not mine:
            return compiled(*args, **kwargs)
        pending = [(listener, listener.before_first_run(lambda: describe(args))) for listener in guards]
        try:
            return compiled(*args, **kwargs)
        finally:
            for listener, written in pending:
                listener.after_first_run(written)

    return run


def watch_compile(listeners: Sequence[Any], describe: Callable[[], Any]) -> list[tuple[Any, Any]]:
    """Before a compile: each listener that watches compiles for hangs (`hang` set) writes the
    graph about to compile as a pending capture (`before_compile(describe)`). Returns what
    `compile_ended` takes once the compile returned or raised."""
    return [(listener, listener.before_compile(describe)) for listener in listeners
            if getattr(listener, "hang", None)]


def compile_ended(pending: Sequence[tuple[Any, Any]]) -> None:
    for listener, written in pending:
        listener.after_compile(written)


@dataclass(frozen=True)
class Pending:
    """A pending capture as `pending.json` describes it."""

    folder: Path
    pid: int
    test: str
    key: str  # the capture key of the graph; the adopted capture's key adds the signature
    level: str
    backend: str
    static_reason: str | None
    program: str = "program.pt2"  # the program file in `folder`: program.pt2, or program.json (program_file)
    phase: str = "first run"  # what the process was doing when it wrote it: "compile" or "first run"
    started: float = 0.0  # time.time() when it was written
    dumps_stack: bool = False  # its process dumps its Python stack on SIGUSR2

    def stopped(self) -> dict[str, Any] | None:
        """What the supervisor wrote when it stopped this process as a hang (None: it did not)."""
        try:
            return dict(json.loads((self.folder / _STOPPED).read_text()))
        except (OSError, ValueError, TypeError):
            return None


def write_pending(directory: Path, program: Any, *, test: str, key: str, level: str, backend: str,
                  phase: str = "first run") -> Path:
    """Write `program` (failed_graph.Program) as a pending capture under `directory/.pending`."""
    folder = directory / PENDING / f"{os.getpid()}-{next(_counter)}"
    folder.mkdir(parents=True, exist_ok=True)
    written = write_program(program.program, program.args, program.kwargs, folder, "program")
    (folder / "spec.json").write_text(written.described_by(program.spec).model_dump_json(indent=2) + "\n")
    meta = {"pid": os.getpid(), "test": test, "key": key, "level": level, "backend": backend,
            "static_reason": program.static_reason, "program": written.name, "phase": phase,
            "started": time.time(), "dumps_stack": _dumps_stack}
    temporary = folder / f"{_META}.tmp"
    temporary.write_text(json.dumps(meta) + "\n")
    temporary.replace(folder / _META)  # last: a folder without it was never complete
    return folder


def compile_threads(backend: str, on_cuda: bool) -> dict[str, int]:
    """The thread count an inductor compile on the CPU baked into its C++ code, as the setting
    `cpp.threads` (none where it is one, or for another backend or device). Inductor writes an
    OpenMP parallel region only for more than one thread, and a bounds check that throws inside one
    terminates the process (SIGABRT) where one thread raises a clean error (pytorch#126691): the
    worker's sandbox children run with fewer threads than the user's process, so a crash capture
    carries the count its program was compiled with."""
    if backend not in ("inductor", "aot_inductor") or on_cuda:
        return {}
    import torch
    import torch._inductor.config

    threads = int(torch._inductor.config.cpp.threads)
    threads = threads if threads > 0 else torch.get_num_threads()
    return {"cpp.threads": threads} if threads > 1 else {}


class UnsavableInputs(Exception):
    """A first run's inputs hold a tensor that no pending capture can keep as what it is."""


def check_savable(inputs: Sequence[Any]) -> None:
    """Raise `UnsavableInputs` naming the first input a pending capture cannot keep: a tensor
    subclass, which torch.save writes but the worker's `torch.load(weights_only=True)` refuses. A
    ZeroTensor (the storage-less zero gradient of `sgn`, pytorch#197067) is kept as a marker
    (`minify_contract.zero_tensors`); conjugate and negative views, sparse and nested tensors are
    saved and read back as they are."""
    import torch

    for position, value in enumerate(inputs):
        if not isinstance(value, torch.Tensor) or zero_tensors.is_zero_tensor(value):
            continue
        if type(value) not in (torch.Tensor, torch.nn.Parameter):
            raise UnsavableInputs(
                f"input {position} is a tensor subclass ({type(value).__qualname__}): the worker reads inputs "
                "with torch.load(weights_only=True), which refuses it")


def drop(folder: Path | None) -> None:
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def drop_own(directory: Path) -> None:
    """Remove this process's pending folders (it is ending normally: none of them crashed)."""
    prefix = f"{os.getpid()}-"
    for folder in _folders(directory):
        if folder.name.startswith(prefix):
            drop(folder)


def pending(directory: Path) -> Iterator[Pending]:
    """The complete pending captures under `directory`."""
    for folder in _folders(directory):
        try:
            meta = json.loads((folder / _META).read_text())
            yield Pending(folder=folder, pid=int(meta["pid"]), test=str(meta["test"]), key=str(meta["key"]),
                          level=str(meta["level"]), backend=str(meta["backend"]),
                          static_reason=meta.get("static_reason"), program=str(meta.get("program", "program.pt2")),
                          phase=str(meta.get("phase", "first run")), started=float(meta.get("started", 0.0)),
                          dumps_stack=bool(meta.get("dumps_stack", False)))
        except (OSError, ValueError, KeyError, TypeError):
            if not _alive(_pid_of(folder)):  # died while writing it: nothing to adopt
                drop(folder)


def _folders(directory: Path) -> list[Path]:
    root = directory / PENDING
    try:
        return sorted(path for path in root.iterdir() if path.is_dir())
    except OSError:
        return []


def _pid_of(folder: Path) -> int:
    try:
        return int(folder.name.split("-", 1)[0])
    except ValueError:
        return -1


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process with that pid
        return True
    return True


def orphaned(entry: Pending) -> bool:
    return entry.pid != os.getpid() and not _alive(entry.pid)


def death_signature(returncode: int) -> str:
    """How the worker's sandbox names the same death: the signal's name, or `ExitStatus: N`."""
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"SIG{-returncode}"
    return f"ExitStatus: {returncode}"


def adopted_key(key: str, signature: str | None) -> str:
    return hashlib.sha256(f"{key} {signature}".encode()).hexdigest()[:16]


def move_into(entry: Pending, destination: Path, name: str, signature: str | None, *, hung: bool = False) -> None:
    """Make the pending folder the capture `destination/<name>.pt2` (`<name>.json` for a
    program.json) + spec.json + inputs.pt, the spec's failure signature set to `signature`; a
    `hung` one's failure is a timeout (no signature: the worker's hang watch times it)."""
    spec = json.loads((entry.folder / "spec.json").read_text())
    failure = spec.setdefault("failure", {})
    failure["kind"] = "timeout" if hung else "crash"
    failure["signature"] = None if hung else signature
    (entry.folder / "spec.json").write_text(json.dumps(spec, indent=2) + "\n")
    (entry.folder / entry.program).rename(entry.folder / f"{name}{Path(entry.program).suffix}")
    (entry.folder / _META).unlink()
    (entry.folder / _STOPPED).unlink(missing_ok=True)
    entry.folder.rename(destination)


def stop_hung(directory: Path, hang_s: float, *, now: float | None = None) -> list[Pending]:
    """Stop every live process whose pending compile or first run under `directory` has lasted
    past `hang_s`: mark its folder (`stopped.json`), ask it for its Python stack (SIGUSR2, where its
    session handed that signal to faulthandler: `dumps_stack`), then kill it. Returns the entries stopped."""
    now = time.time() if now is None else now
    stopped: list[Pending] = []
    for entry in pending(directory):
        lasted = now - entry.started
        if entry.started <= 0 or lasted <= hang_s or entry.stopped() is not None or not _alive(entry.pid):
            continue
        marker = {"phase": entry.phase, "lasted_s": round(lasted, 1), "bound_s": hang_s}
        (entry.folder / _STOPPED).write_text(json.dumps(marker) + "\n")
        then = "its Python stack, then it is stopped" if entry.dumps_stack else "it is stopped"
        print(f"minify: the {entry.phase} of a compiled graph in process {entry.pid} has lasted {lasted:.0f} s, "
              f"past {HANG_ENV}={hang_s:g}: a hang; {then}", file=sys.stderr, flush=True)
        stopped.append(entry)
    if not stopped:
        return stopped
    asked = [entry for entry in stopped if entry.dumps_stack]
    for entry in asked:
        _signal(entry.pid, signal.SIGUSR2)
    if asked:
        time.sleep(_DUMP_S)
    killed = []
    for entry in stopped:
        # A compile that ended while its stack was dumped took its folder (and the mark) with it: the
        # process has gone on to other work, which a kill now would strike and be blamed on.
        if not (entry.folder / _STOPPED).exists():
            print(f"minify: the {entry.phase} in process {entry.pid} ended before it was stopped: not a hang",
                  file=sys.stderr, flush=True)
            continue
        _signal(entry.pid, signal.SIGKILL)
        killed.append(entry)
    return killed


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError:  # it ended meanwhile
        pass


def dump_stack_on_request() -> None:
    """In a hang-watching child: SIGUSR2 dumps every thread's Python stack to stderr (C-level, so
    it works inside a compile that never returns to the interpreter). A program that handles
    SIGUSR2 itself keeps its handler."""
    global _dumps_stack
    if signal.getsignal(signal.SIGUSR2) in (signal.SIG_DFL, None):
        faulthandler.register(signal.SIGUSR2, all_threads=True)
        _dumps_stack = True


def supervise(command: Sequence[str], *, cwd: str | os.PathLike[str] | None = None,
              directory: Path | None = None, hang_s: float | None = None) -> tuple[int, int]:
    """Run `command` as a child with SUPERVISED_ENV set and wait for it: (its pid, its returncode,
    -N for a signal). Ctrl-C reaches the child from the terminal, so it is ignored here meanwhile;
    SIGTERM and SIGHUP sent to this process are passed on. With `hang_s`, the pending captures in
    `directory` are watched meanwhile and a process hung past it stopped (`stop_hung`)."""
    environment = {**os.environ, SUPERVISED_ENV: str(os.getpid())}
    child = subprocess.Popen(list(command), cwd=cwd, env=environment)
    forwarded = {signal.SIGTERM: None, signal.SIGHUP: None}

    def forward(signum: int, frame: Any) -> None:
        child.send_signal(signum)

    previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    for signum in forwarded:
        forwarded[signum] = signal.signal(signum, forward)
    try:
        while True:
            try:
                returncode = child.wait(timeout=_WATCH_S if hang_s and directory is not None else None)
                break
            except subprocess.TimeoutExpired:
                stop_hung(directory, hang_s)  # type: ignore[arg-type]
    finally:
        signal.signal(signal.SIGINT, previous_int)
        for signum, handler in forwarded.items():
            signal.signal(signum, handler)
    return child.pid, returncode


def end_like(returncode: int, *, hung: bool = False) -> int:
    """This process's exit status for a child that ended with `returncode`: the same code, or, for
    a child killed by a signal, this process killed by it too (faulthandler first switched off,
    so a dump of this process's own stack does not follow the child's); `HUNG_EXIT` for a child
    the supervisor stopped as a hang."""
    if hung and returncode == -signal.SIGKILL:
        return HUNG_EXIT
    if returncode >= 0:
        return returncode
    sys.stdout.flush()
    sys.stderr.flush()
    if faulthandler.is_enabled():
        faulthandler.disable()
    if -returncode not in (signal.SIGKILL, signal.SIGSTOP):  # their handlers cannot be set: always the default
        signal.signal(-returncode, signal.SIG_DFL)
    os.kill(os.getpid(), -returncode)
    return 128 - returncode  # a signal that does not end the process (ignored by default): as a shell says it
