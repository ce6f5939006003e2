"""One run of a job's repro.py (with its inputs.pt) under one torch installation, classified.

The repro is plain torch: it needs nothing of minify, so any interpreter with a torch runs it. It
runs as a child of its own process group (everything it starts, inductor's compile workers
included, dies with it), in an empty working folder of its own, with stdin closed and a timeout;
what it prints decides the outcome (`ranges.classify`: `repro passed`, or the `repro failed
with:` line its excepthook writes). It is no sandbox child: a repro is one run of a program the
job already ran hundreds of times in the sandbox, and the interpreter is another torch's, which
the sandbox's fork server cannot host.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from minify_client.models import VersionRun
from minify_worker.versions.envs import TorchEnv
from minify_worker.versions.ranges import classify

DEFAULT_TIMEOUT_S = 300.0  # a fresh interpreter's torch import and one compile, on a loaded box
TIMEOUT_ENV = "MINIFY_VERSION_PROBE_TIMEOUT_S"
_OUTPUT_KEPT = 64 * 1024


def probe_timeout_s() -> float:
    return float(os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT_S)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


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
    with tempfile.TemporaryDirectory(prefix="minify-version-probe-") as workdir:
        process = subprocess.Popen(command, cwd=workdir, env=_environment(), stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
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
