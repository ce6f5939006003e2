"""What a job may spend: its time to the deadline (`Budget`) and its children at once (`default_parallelism`).

The deadline is the job's `limits.job_timeout_s` from when its clock started; a cancel ends it
sooner. Every wait of the job asks `stop_reason`, every child gets at most `remaining` seconds,
and a phase that a stop cuts short ends the job as `when_stopped` says: cancelled, or succeeded
with the smallest failing program found so far.
"""

from __future__ import annotations

import threading
import time

from minify_contract.models import JobSpec, JobState
from minify_worker.engine.delivery import Ending
from minify_worker.sandbox.limits import usable_cores, worker_parallelism


def default_parallelism(spec: JobSpec) -> int:
    """The job's own `limits.parallelism`; else the worker's (`worker_parallelism`); else what the
    device can hold: one child per core on CPU, a few per GPU (they share its memory)."""
    if spec.limits.parallelism:
        return spec.limits.parallelism
    configured = worker_parallelism()
    if configured is not None:
        return configured
    return max(1, min(usable_cores(), 4 if spec.device_class == "cuda" else 16))


class Budget:
    """One job's time: `started` (the job's clock) plus `limits.job_timeout_s`, unless `cancel` is set
    first; and its `parallelism`, the sandbox children it runs at once."""

    def __init__(self, spec: JobSpec, started: float, cancel: threading.Event) -> None:
        self.parallelism = default_parallelism(spec)
        self.job_timeout_s = spec.limits.job_timeout_s
        self.deadline = started + self.job_timeout_s
        self.cancel = cancel

    @property
    def cancelled(self) -> bool:
        return self.cancel.is_set()

    def stop_reason(self) -> str | None:
        """Why the job must stop now (a cancel, the deadline), or None."""
        if self.cancel.is_set():
            return "cancelled"
        if time.monotonic() > self.deadline:
            return f"job timeout of {self.job_timeout_s:g}s reached"
        return None

    def remaining(self) -> float:
        """The seconds left to the deadline (at least one, for a wait that must still be given a bound)."""
        return max(1.0, self.deadline - time.monotonic())

    def stopped_status(self) -> JobState:
        """A job stopped before it had a result: cancelled, or failed (out of time)."""
        return JobState.cancelled if self.cancel.is_set() else JobState.failed

    def when_stopped(self, reason: str, caveat: str | None = None) -> Ending:
        """A job stopped with a result: cancelled, or, out of time, succeeded with the smallest failing
        program found so far (cut short: no culprit phase follows its delivery), and `caveat`, what
        the time cut short about the result itself (`OriginalRun.unheld_hang`), said after it."""
        if self.cancel.is_set():
            return Ending(JobState.cancelled, reason)
        said = f"{reason}: the result is the smallest failing program found so far"
        return Ending(JobState.succeeded, f"{said}; {caveat}" if caveat else said, cut_short=True)
