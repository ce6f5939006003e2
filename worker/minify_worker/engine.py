"""The engine's entry point: minify one program, offline or inside an RQ job (docs/internals.md)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from minify_client.models import JobSpec, JobState, ProgressEvent, Report


@dataclass
class MinifyResult:
    status: JobState
    reason: str | None
    report: Report
    artifacts: dict[str, Path] = field(default_factory=dict)


def minify(
    program: Path,
    spec: JobSpec,
    out_dir: Path,
    *,
    inputs: Path | None = None,
    on_event: Callable[[ProgressEvent], None] | None = None,
    cancel: threading.Event | None = None,
) -> MinifyResult:
    """Minify `program`; user errors come back as a `failed`/`not_reproducible` result, never raised."""
    raise NotImplementedError("the engine lands in the engine issue")
