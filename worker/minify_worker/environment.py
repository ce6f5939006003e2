"""The worker's environment, as a PyTorch bug report asks for it (`python -m torch.utils.collect_env`).

Gathered in a sandbox child (`collect_in_child`, a `SandboxPool.call` target) with torch's own
`torch.utils.collect_env` helpers: the engine's process and the fork server must never initialize
CUDA, and the helpers run subprocesses (nvidia-smi, nvcc, the compilers) that a child can afford
to wait on. Each subprocess is bounded by `COMMAND_TIMEOUT_S`, and pip/conda listings (the slow
part of `collect_env`) are skipped. Keys are `collect_env`'s own labels where it has one, so the
block reads as the output a PyTorch issue asks for.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import signal
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import torch

CALL_TARGET = "minify_worker.environment:collect_in_child"
# One subprocess (nvidia-smi on a busy GPU machine can take seconds); the whole call.
COMMAND_TIMEOUT_S = 5.0
CALL_TIMEOUT_S = 30.0
NOT_COLLECTED = "Could not collect"  # collect_env's own words for a missing value
ERROR_KEY = "Collection error"

RunLambda = Callable[[str | list[str]], tuple[int, str, str]]


def collect_in_child(context: Any, command_timeout_s: float = COMMAND_TIMEOUT_S) -> dict[str, str]:
    """The environment of the machine the job runs on: a `SandboxPool.call` target (`context` unused)."""
    return collect(command_timeout_s)


def collect(command_timeout_s: float = COMMAND_TIMEOUT_S) -> dict[str, str]:
    """Python, torch (and its git version), CUDA, cuDNN, GPU and driver, triton, the C++ compiler, the OS.

    Runs subprocesses and may initialize CUDA libraries: call it in a sandbox child only.
    """
    from torch.utils import collect_env

    run = _bounded_run(command_timeout_s)
    fields: list[tuple[str, Callable[[], object]]] = [
        ("PyTorch version", lambda: torch.__version__),
        ("PyTorch git version", lambda: torch.version.git_version),
        ("Is debug build", lambda: torch.version.debug),
        ("CUDA used to build PyTorch", lambda: torch.version.cuda or "None"),
        ("OS", lambda: collect_env.get_os(run)),
        ("Libc version", collect_env.get_libc_version),
        ("Python version", lambda: f"{sys.version.replace(chr(10), ' ')} ({sys.maxsize.bit_length() + 1}-bit runtime)"),
        ("Python platform", collect_env.get_python_platform),
        ("C++ compiler (inductor)", lambda: _cpp_compiler(run)),
        ("GCC version", lambda: collect_env.get_gcc_version(run)),
        ("Clang version", lambda: collect_env.get_clang_version(run)),
        # NVML-based with PYTORCH_NVML_BASED_CUDA_CHECK=1 (set by every worker entry point).
        ("Is CUDA available", torch.cuda.is_available),
        ("CUDA runtime version", lambda: collect_env.get_running_cuda_version(run)),
        ("GPU models and configuration", lambda: collect_env.get_gpu_info(run)),
        ("Nvidia driver version", lambda: collect_env.get_nvidia_driver_version(run)),
        ("cuDNN version", lambda: torch.backends.cudnn.version() or collect_env.get_cudnn_version(run)),
        ("Triton version", _triton_version),
        ("CPU", lambda: collect_env.run_and_parse_first_match(run, "lscpu", r"Model name:\s*(.*)")),
    ]
    environment: dict[str, str] = {}
    for key, read in fields:
        try:
            value = read()
        except Exception as error:  # one missing tool must not cost the others
            value = f"{NOT_COLLECTED} ({type(error).__name__}: {error})"
        environment[key] = NOT_COLLECTED if value is None else str(value)
    return environment


def collected(call: Future[dict[str, Any]] | None, wait_s: float = CALL_TIMEOUT_S,
              stopped: str | None = None) -> dict[str, str]:
    """The result of a `collect_in_child` call, waiting at most `wait_s`; if the call failed, what
    the engine knows without a subprocess or CUDA, and the error under `ERROR_KEY`.

    `stopped` (why the job ends early, e.g. a cancel): no wait at all; a call still running is
    cancelled (its child dies) and the error says why. The collection runs tools that take seconds,
    tens of seconds on a loaded machine, and a cancel must not wait for them."""
    if call is None:
        return {}
    if stopped is not None and not call.done():
        call.cancel()
        error = f"not collected: {stopped}"
    else:
        try:
            return dict(call.result(timeout=wait_s))
        except FutureTimeout:
            error = f"not collected within {wait_s:g} s"
        except BaseException as failure:  # a failed or cancelled call costs the environment, never the job
            error = f"{type(failure).__name__}: {failure}" if str(failure) else type(failure).__name__
    return {
        "PyTorch version": torch.__version__,
        "Python version": sys.version.split()[0],
        "Python platform": platform.platform(),
        ERROR_KEY: error,
    }


def _cpp_compiler(run: RunLambda) -> str:
    """The compiler inductor's C++ backend uses, and the first line of its `--version`."""
    from torch._inductor import cpp_builder
    from torch.utils import collect_env

    compiler = cpp_builder.get_cpp_compiler()
    version = collect_env.run_and_return_first_line(run, [compiler, "--version"])
    return f"{compiler}: {version}" if version else compiler


def _triton_version() -> str | None:
    for distribution in ("triton", "pytorch-triton", "pytorch-triton-rocm", "triton-xpu"):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _bounded_run(timeout_s: float) -> RunLambda:
    """`collect_env.run` with a timeout: the command's whole process group dies when it runs over."""

    def run(command: str | list[str]) -> tuple[int, str, str]:
        try:
            process = subprocess.Popen(command, shell=isinstance(command, str), stdin=subprocess.DEVNULL,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as error:  # the tool is not installed
            return 127, "", str(error)
        try:
            out, err = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            return 124, "", f"timed out after {timeout_s:g} s"
        return process.returncode, out.decode(errors="replace").strip(), err.decode(errors="replace").strip()

    return run
