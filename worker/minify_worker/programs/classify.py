"""How a run of one candidate becomes an `Outcome`, for every representation's runner (in a sandbox
child): an exception is out of memory, an unusable device (the sandbox's fault, raised), or a
failure with its signature; several runs of one compiled program are one outcome."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable

from minify_contract import signatures
from minify_worker import oracle
from minify_worker.outcomes import Fails, Outcome, OutOfMemory, Passes

_OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory", "std::bad_alloc")

# What torch says when this process cannot use the job's device at all: the sandbox's problem (a
# fork after CUDA was initialized, a CPU-only build, no driver, a missing device), never the bug.
_ENVIRONMENT_FAULT = re.compile(
    r"Cannot re-initialize CUDA in forked subprocess|Torch not compiled with CUDA enabled|"
    r"Found no NVIDIA driver|No CUDA GPUs are available|CUDA driver initialization failed|"
    r"CUDA call failed lazily at initialization|invalid device ordinal|"
    r"CUDA driver version is insufficient|no kernel image is available for execution on the device"
)


class EnvironmentFault(Exception):
    """This child cannot run the job's candidates at all (see `environment_fault`)."""


def environment_fault(error: BaseException) -> str | None:
    """The message of `error` (or of any exception it wraps) if it says the device is unusable in
    this process, rather than anything about the candidate."""
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in seen and len(seen) < 8:
        seen.append(current)
        for _, message in signatures.exception_chain(current):
            found = _ENVIRONMENT_FAULT.search(message)
            if found:
                line = next((text for text in message.splitlines() if found.group(0) in text), found.group(0))
                return f"the job's device is unusable in this sandbox child: {line.strip()}"
        current = current.__cause__ or current.__context__
    return None


def is_out_of_memory(error: BaseException) -> bool:
    error = oracle.unwrap_exception(error)
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return True
    text = str(error).lower()
    return any(marker in text for marker in _OOM_MARKERS)


def failure(error: BaseException, kind: str, started: float) -> Outcome:
    """What an exception while compiling (`kind` `compile_error`) or running (`runtime_error`) a
    candidate means; raises `EnvironmentFault` when the device cannot be used at all."""
    fault = environment_fault(error)
    if fault is not None:
        raise EnvironmentFault(fault) from error
    duration = time.monotonic() - started
    if is_out_of_memory(error):
        return OutOfMemory(message=str(oracle.unwrap_exception(error))[:2000], duration_s=duration)
    return Fails(signature=oracle.signature_from_exception(error, kind), duration_s=duration)  # type: ignore[arg-type]


def repeated(run_once: Callable[[], Outcome], runs: int, compile_s: float,
             stops: Callable[[Outcome], bool] = lambda outcome: False) -> Outcome:
    """`runs` runs of one compiled program as one outcome: the first failure, with how many runs
    failed like it (fewer than `runs`: flaky). Its duration is the compile plus the slowest run,
    what one candidate would take. No run follows one that `stops` says ends them."""
    outcomes: list[Outcome] = []
    for _ in range(max(1, runs)):
        outcome = run_once()
        outcomes.append(outcome)
        if stops(outcome):
            break
    duration = compile_s + max(getattr(outcome, "duration_s", 0.0) for outcome in outcomes)
    first = next((outcome for outcome in outcomes if not isinstance(outcome, Passes)), None)
    if first is None:
        return Passes(duration_s=duration, runs=len(outcomes))
    if not isinstance(first, Fails):
        return first
    failed = sum(1 for outcome in outcomes if isinstance(outcome, Fails) and outcome.signature.same_as(first.signature))
    return dataclasses.replace(first, duration_s=duration, runs=len(outcomes), failed_runs=failed)
