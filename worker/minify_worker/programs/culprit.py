"""What a culprit phase found, as the job says it, whatever the representation that has one
(`Representation.culprit`): report.json's culprit fields, and repro.py's header lines (while the
phase runs, once it found something, or when it stopped; none for a program without a phase)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from minify_contract.models import Culprit, CulpritState, JobSpec, Workaround
from minify_contract.summaries import culprit_text


@dataclass
class Found:
    """What the phase found, as report.json says it (`report_fields`)."""

    culprit: Culprit | None = None
    reason: str | None = None
    workarounds: list[Workaround] = field(default_factory=list)
    tried: dict[str, str] = field(default_factory=dict)


PENDING_REASON = "pending: the culprit phase runs after the repro is delivered"


def report_fields(found: Found | None, spec: JobSpec, *, has_phase: bool = True) -> dict[str, Any]:
    """report.json's culprit_state, culprit, culprit_reason, workarounds and workarounds_tried, for
    a phase that found `found`, or (None) did not run; `has_phase`: whether the job's program has
    a culprit phase at all."""
    if found is None:
        reason = ("not asked for (spec culprit: false)" if not spec.culprit
                  else f"none for {spec.program_format} programs: the culprit phase bisects torch's compiler"
                  if not has_phase else "not run: the job ended before the culprit phase")
        return stopped_fields(CulpritState.skipped, reason)
    return {"culprit_state": CulpritState.done, "culprit": found.culprit, "culprit_reason": found.reason,
            "workarounds": found.workarounds, "workarounds_tried": found.tried}


def pending_fields() -> dict[str, Any]:
    """The same fields in the result delivered before the phase runs."""
    return stopped_fields(CulpritState.running, PENDING_REASON)


def stopped_fields(state: CulpritState, reason: str) -> dict[str, Any]:
    """The same fields for a phase that did not run (`skipped`), is `running`, or stopped
    (`cancelled`, `lost`), and why."""
    return {"culprit_state": state, "culprit": None, "culprit_reason": reason, "workarounds": [],
            "workarounds_tried": {}}


def pending_header_lines() -> list[str]:
    """repro.py's header lines while the phase runs (replaced when it ends)."""
    return [f"Culprit:          {PENDING_REASON} (report.json has it once done)"]


def stopped_header_lines(reason: str) -> list[str]:
    """repro.py's header lines for a phase that stopped before its finding."""
    return [f"Culprit:          none: {reason}"]


def header_lines(found: Found | None) -> list[str]:
    """repro.py's header lines for the phase's finding (none when it did not run)."""
    if found is None:
        return []
    culprit = (f"{culprit_text(found.culprit)} (torch's compiler bisector, on this program)"
               if found.culprit else f"none: {found.reason}")
    lines = [f"Culprit:          {culprit}"]
    if found.culprit and found.reason:
        lines.append(f"                  {found.reason}")
    if found.workarounds:
        lines += [f"Workaround:       {w.setting}={w.value!r} ({w.verified_on})" for w in found.workarounds]
    else:
        lines.append("Workarounds:      none verified")
    return lines
