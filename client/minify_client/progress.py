"""Showing a job's progress events: a rich progress bar on a terminal, plain lines in CI logs."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol, TextIO

from minify_contract.models import (
    ProgressEvent,
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
