"""The culprit phase as a job runs it: after the result was delivered, find the culprit and rewrite
what was delivered (report.json, repro.py's header, the bundle) with what it found."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from minify_contract.models import CulpritState, JobSpec, Report
from minify_worker.engine import artifacts
from minify_worker.outcomes import Signature, Stopped
from minify_worker.programs.culprit import (
    header_lines,
    pending_header_lines,
    report_fields,
    stopped_fields,
    stopped_header_lines,
)
from minify_worker.programs.fx.culprit.phase import find
from minify_worker.sandbox import SandboxError

log = logging.getLogger(__name__)


def after_result(evaluator: Any, delivered: Report, out_dir: Path, *, original: Any, minimal: Any,
                 target: Signature, spec: JobSpec, timeout_s: float, budget: float,
                 should_stop: Callable[[], str | None], say: Callable[[str], None],
                 ) -> tuple[Report, CulpritState]:
    """Run the phase (`find`) and rewrite the delivered artifacts in `out_dir` with its finding: the
    report with the phase's fields, and the phase's state. A stop (a cancel, the job's
    timeout) or a sandbox failure ends the phase, never the delivered job; a rewrite that fails
    leaves the delivered files as they are."""
    state, found = CulpritState.done, None
    try:
        found = find(evaluator, original=original, minimal=minimal, target=target, spec=spec, timeout_s=timeout_s,
                     budget=budget, should_stop=should_stop, say=say)
        fields = report_fields(found, spec)
    except Stopped as stopped:
        state = CulpritState.cancelled
        fields = stopped_fields(state, f"cancelled: {stopped.reason} (the repro was delivered before)")
    except SandboxError as error:
        state = CulpritState.lost
        fields = stopped_fields(state, f"lost: the sandbox failed during the culprit phase: {error}")
    report = delivered.model_copy(update=fields)
    try:
        artifacts.rewrite_for_culprit(out_dir, report, pending_header_lines(),
                                      header_lines(found) if state is CulpritState.done
                                      else stopped_header_lines(fields["culprit_reason"]))
    except (OSError, artifacts.ArtifactWriteError) as error:
        log.warning("could not rewrite the artifacts with the culprit: %s", error)
    return report, state
