"""One run of a job's repro.py (with its inputs.pt) under one torch installation, classified.

The repro is plain torch: it needs nothing of minify, so any interpreter with a torch runs it. It
runs as a child of its own process group (everything it starts, inductor's compile workers
included, dies with it), in a working folder of its own (empty but for its owner's mark), with
stdin closed and a timeout; what it prints decides the outcome (`ranges.classify`: `repro passed`,
or the `repro failed with:` line its excepthook writes). It is no sandbox child: a repro is one run of a program the
job already ran hundreds of times in the sandbox, and the interpreter is another torch's, which
the sandbox's fork server cannot host.

A probe never outlives what asked for it: the repro gets `PR_SET_PDEATHSIG=SIGKILL` (the work horse
killed outright), and `stop_all` kills the group of every probe still running (a cancelled job, a
SIGTERM in the horse: `stop_on_sigterm`), so a worker's shutdown leaves no repro or compiler behind.
Nor a working folder for long: a probe's is marked with the process that made it
(`engine.workdirs`, as a job's is), and the next probe on the machine, like a worker starting or
seeing a work horse die, removes those whose process is gone (one killed outright cleans nothing up).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from minify_contract.models import VersionRun
from minify_worker.engine.workdirs import PROBE_PREFIX, make_job_dir, remove_stale_job_dirs
from minify_worker.service.versions.envs import TorchEnv
from minify_worker.service.versions.ranges import classify

DEFAULT_TIMEOUT_S = 300.0  # a fresh interpreter's torch import and one compile, on a loaded box
TIMEOUT_ENV = "MINIFY_VERSION_PROBE_TIMEOUT_S"
_OUTPUT_KEPT = 64 * 1024
_PR_SET_PDEATHSIG = 1

_running: set[int] = set()  # process groups of the probes running in this process
_running_lock = threading.Lock()


def probe_timeout_s() -> float:
    return float(os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT_S)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def stop_all() -> None:
    """Kill every probe running in this process, with what it started (a cancelled job's phase,
    a worker shutting down); each `run_repro` then returns at once."""
    with _running_lock:
        groups = list(_running)
    for pid in groups:
        _kill_group(pid)


def stop_on_sigterm() -> None:
    """In an RQ entry that runs probes: SIGTERM (the worker's cold shutdown) kills the running
    probes' groups first, then the horse dies of it as it would have."""
    def terminate(signum: int, frame: FrameType | None) -> None:
        stop_all()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, terminate)


@contextmanager
def _workdir() -> Iterator[str]:
    """A probe's working folder, marked with this process, made after removing those of probes
    whose process died without removing theirs; removed when the probe ends."""
    remove_stale_job_dirs(prefixes=(PROBE_PREFIX,))
    folder = make_job_dir(PROBE_PREFIX)
    try:
        yield str(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _die_with_parent() -> None:
    """preexec_fn: the repro is killed when the process that started it dies."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _environment() -> dict[str, str]:
    """The worker's environment (PYTHONPATH finds a custom backend or op module the repro imports),
    with inductor compiling in the probe's own process: no pool of compile workers per probe."""
    return {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def run_repro(env: TorchEnv, repro: Path, inputs: Path | None, expected_signature: str | None,
              timeout_s: float | None = None) -> VersionRun:
    """Run `repro` under `env`'s interpreter and say how it went against `expected_signature`."""
    timeout_s = probe_timeout_s() if timeout_s is None else timeout_s
    command = [str(env.python), str(repro.resolve())]
    if inputs is not None and inputs.is_file():
        command += ["--inputs", str(inputs.resolve())]
    started = time.monotonic()
    with _workdir() as workdir:
        process = subprocess.Popen(command, cwd=workdir, env=_environment(), stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                   preexec_fn=_die_with_parent)
        with _running_lock:
            _running.add(process.pid)
        returncode: int | None
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
            returncode = process.returncode
        except subprocess.TimeoutExpired:
            _kill_group(process.pid)
            stdout, stderr = process.communicate()
            returncode = None
        finally:
            _kill_group(process.pid)  # what it left behind in its group
            with _running_lock:
                _running.discard(process.pid)
    seconds = round(time.monotonic() - started, 2)
    signal_name = None
    if returncode is not None and returncode < 0:
        try:
            signal_name = signal.Signals(-returncode).name
        except ValueError:
            signal_name = f"SIG{-returncode}"
    found = classify(returncode, stdout[-_OUTPUT_KEPT:].decode(errors="replace"),
                     stderr[-_OUTPUT_KEPT:].decode(errors="replace"), expected_signature, timeout_s=timeout_s,
                     signal_name=signal_name)
    return VersionRun(torch=env.torch, git_version=env.git_version, outcome=found.outcome, signature=found.signature,
                      reason=found.reason, seconds=seconds)
