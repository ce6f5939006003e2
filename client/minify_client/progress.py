"""Showing a job's progress events: a rich progress bar on a terminal, plain lines in CI logs."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol, TextIO

from minify_client.models import (
    Bisection,
    Culprit,
    CulpritState,
    JobState,
    JobStatus,
    OriginalState,
    ProgressEvent,
    Report,
)


class ProgressView(Protocol):
    """`start()`, `update(event)` for each event, `close()` (also when start was interrupted)."""

    def start(self) -> None: ...

    def update(self, event: ProgressEvent) -> None: ...

    def close(self) -> None: ...


def describe(event: ProgressEvent) -> str:
    """One line for a progress event: `phase: 40 → 12 nodes, 37 checks (15 cached)`."""
    if event.type == "status":
        state = event.status.value if event.status else "?"
        if not event.message or event.message == state:
            return f"status: {state}"
        # Servers often say it in full already: "running on host-3 (attempt 1)".
        if event.message.startswith(state):
            return f"status: {event.message}"
        return f"status: {state} ({event.message})"
    if event.type == "log":
        return event.message or ""
    phase = event.phase or "working"
    detail = _counts(event)
    return f"{phase}: {detail}" if detail else phase


def _counts(event: ProgressEvent) -> str:
    parts = []
    if event.nodes_original is not None and event.nodes_current is not None:
        parts.append(f"{event.nodes_original} → {event.nodes_current} nodes")
    elif event.nodes_current is not None:
        parts.append(f"{event.nodes_current} nodes")
    if event.checks_total:
        checks = f"{event.checks_total} checks"
        if event.checks_cached:
            checks += f" ({event.checks_cached} cached)"
        parts.append(checks)
    if event.checks_in_flight:
        parts.append(f"{event.checks_in_flight} running")
    return ", ".join(parts)


class PlainProgress:
    """Progress as lines, for logs: a line when the phase, node count or status changes, when
    the server logs something, and otherwise at most one line every `interval_s` seconds."""

    def __init__(
        self, stream: TextIO, *, interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._stream = stream
        self._interval_s = interval_s
        self._clock = clock
        self._last_key: tuple[object, ...] | None = None
        self._last_text: str | None = None
        self._last_time = float("-inf")
        # Log and status events may carry no elapsed time; show the latest known instead.
        self._elapsed_s = 0.0

    def start(self) -> None:
        pass

    def update(self, event: ProgressEvent) -> None:
        now = self._clock()
        self._elapsed_s = max(self._elapsed_s, event.elapsed_s)
        text = describe(event)
        if event.type == "progress":
            key: tuple[object, ...] = (event.phase, event.nodes_current)
            due = now - self._last_time >= self._interval_s
            if key == self._last_key and (not due or text == self._last_text):
                return
            self._last_key = key
        elif not text:
            return
        self._stream.write(f"[{self._elapsed_s:7.1f}s] {text}\n")
        self._stream.flush()
        self._last_text = text
        self._last_time = now

    def close(self) -> None:
        self._stream.flush()


class RichProgress:
    """A live progress bar: the fraction of the original nodes removed so far."""

    def __init__(self, stream: TextIO) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=Console(file=stream),
            transient=False,
        )
        self._task = self._progress.add_task("waiting", total=None, detail="")

    def start(self) -> None:
        with _ctrl_c_deferred():
            self._progress.start()

    def update(self, event: ProgressEvent) -> None:
        if event.type == "log":
            if event.message:
                self._progress.console.print(event.message, markup=False, highlight=False)
            return
        if event.type == "status":
            self._progress.update(self._task, description=describe(event))
            return
        fields: dict[str, object] = {"description": event.phase or "working", "detail": _counts(event)}
        if event.nodes_original and event.nodes_current is not None:
            fields["total"] = event.nodes_original
            fields["completed"] = event.nodes_original - event.nodes_current
        self._progress.update(self._task, **fields)  # type: ignore[arg-type]

    def close(self) -> None:
        with _ctrl_c_deferred():
            self._progress.stop()


@contextmanager
def _ctrl_c_deferred() -> Iterator[None]:
    """A Ctrl-C inside takes effect when the block ends: rich's live display, half started or half
    stopped, would leave the terminal's cursor hidden and sys.stdout and sys.stderr redirected to it."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is None or threading.current_thread() is not threading.main_thread():
        yield  # a handler not set from Python cannot be put back; only the main thread may set one
        return
    received: list[int] = []
    signal.signal(signal.SIGINT, lambda number, frame: received.append(number))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            signal.raise_signal(signal.SIGINT)  # as if it came now: KeyboardInterrupt, or ignored


def progress_view(stream: TextIO, *, plain: bool | None = None) -> ProgressView:
    """A rich bar when `stream` is a terminal, plain lines otherwise (CI logs, pipes)."""
    if plain is None:
        plain = not stream.isatty()
    return PlainProgress(stream) if plain else RichProgress(stream)


def shrunk_inputs(report: Report) -> str | None:
    """`inputs shrunk: x 256x128 → 1x1, w 128 → 1` for the inputs the shrink phase made smaller."""
    def dims(shape: list[int]) -> str:
        return "x".join(map(str, shape)) or "scalar"

    changes = [f"{name} {dims(before.shape)} → {dims(after.shape)}"
               for name, before in report.input_shapes_original.items()
               if (after := report.input_shapes_final.get(name)) is not None and after.shape != before.shape]
    return f"inputs shrunk: {', '.join(changes)}" if changes else None


def culprit_text(culprit: Culprit) -> str:
    """`inductor / lowerings #0: relu`: the stage, the subsystem, which application, what it was."""
    text = " / ".join(part for part in (culprit.backend, culprit.subsystem) if part)
    if culprit.bisect_number is not None and culprit.detail != culprit.subsystem:
        text += f" #{culprit.bisect_number}"
    if culprit.detail:
        text += f": {culprit.detail}"
    return text


def culprit_summary(report: Report) -> str | None:
    """`culprit: inductor / lowerings #0: relu; workarounds: backend='aot_eager'`, or None when the
    culprit phase did not run (nothing to say about either); `culprit: pending ...` while it runs
    (after the repro was delivered)."""
    if report.culprit_state is CulpritState.running:
        return "culprit: pending (torch's compiler bisector runs on the minimal program after the repro is delivered)"
    if report.culprit is None and report.culprit_reason is None:
        return None
    found = culprit_text(report.culprit) if report.culprit else "none"
    if report.culprit_reason:
        found += f" ({report.culprit_reason})"
    flips = ", ".join(f"{w.setting}={w.value!r}" for w in report.workarounds) or "none verified"
    return f"culprit: {found}; workarounds: {flips}"


def original_summary(report: Report) -> str | None:
    """`original: confirmed (failed 1 of 1 runs)`, `original: running (its verdict follows the
    delivered result)`, `original: not_reproduced: ... (the result is kept)`; None when the report
    has no verdict (written before there was one, or the job ended before it)."""
    state = report.original_state
    if state is None:
        return None
    if state is OriginalState.running:
        return "original: running (its verdict follows the delivered result)"
    if state is OriginalState.confirmed:
        return f"original: confirmed (failed {report.original_failures} of {report.original_runs} runs)"
    line = f"original: {state.value}" + (f": {report.original_verdict}" if report.original_verdict else "")
    return line + (" (the result is kept)" if report.status is JobState.succeeded else "")


def original_output_lines(report: Report) -> list[str]:
    """The original's own output in the worker (what it printed, and raised), indented under a
    heading, where it did not fail the wanted way; [] otherwise."""
    if report.original_output is None or report.original_state is not OriginalState.not_reproduced:
        return []
    output = report.original_output.rstrip()
    if not output:
        return ["the original's output in the worker: none (it printed nothing and raised nothing)"]
    return ["the original's output in the worker:", *(f"  {line}" for line in output.splitlines())]


def not_reproduced_lines(report: Report) -> list[str]:
    """For a job whose original did not fail the wanted way: `next: ...` (what to try) and the
    original's own output; [] otherwise."""
    return ([f"next: {report.next_step}"] if report.next_step else []) + original_output_lines(report)


def bisect_summary(bisection: Bisection) -> str:
    """`first bad 2.14.1 (last good 2.14.0; git a..b), 3 installs` or why it stopped."""
    if bisection.state == "running":
        return f"bisecting {bisection.good}..{bisection.bad}: {len(bisection.steps)} runs so far"
    if bisection.first_bad is None:
        return f"bisection {bisection.good}..{bisection.bad} stopped: {bisection.reason}"
    commits = f"; git {bisection.commits}" if bisection.commits else ""
    note = f"; {bisection.reason}" if bisection.reason else ""
    return (f"first bad {bisection.first_bad} (last good {bisection.last_good}{commits}), "
            f"{bisection.installs} installs, {len(bisection.steps)} runs{note}")


def versions_summary(report: Report) -> str | None:
    """`versions: fails on 2.14.1, 2.15.0; passes on 2.13.0: regression in (2.13.0, 2.14.1]`, or None
    when the version phase did not run; `versions: pending ...` while it runs (after the result)."""
    if report.versions_state is CulpritState.running:
        return "versions: pending (repro.py runs under the other torch versions the workers offer)"
    if report.versions_summary:
        return f"versions: {report.versions_summary}"
    return f"versions: {report.versions_state.value}" if report.versions_state else None


def summary(status: JobStatus) -> str:
    """The final line for a finished job: `succeeded: 40 → 3 nodes, 37 checks (15 cached) in 12.3s`."""
    state = status.status
    report = status.result
    if state == JobState.succeeded and report is not None:
        counts = []
        if report.nodes_original is not None and report.nodes_final is not None:
            counts.append(f"{report.nodes_original} → {report.nodes_final} nodes")
        if report.checks_total:
            counts.append(
                f"{report.checks_total} checks"
                + (f" ({report.checks_cached} cached)" if report.checks_cached else "")
            )
        detail = ", ".join(counts)
        return f"succeeded: {detail} in {report.elapsed_s:.1f}s" if detail else "succeeded"
    reason = status.reason or (report.reason if report is not None else None)
    label = state.value.replace("_", " ")
    return f"{label}: {reason}" if reason else label
