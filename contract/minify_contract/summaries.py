"""How a report reads in one line: the same words in both command lines, the job page's events,
the job record and repro.py's header (the culprit, the original's verdict, the versions, a
bisection, the shrunk inputs, a finished job)."""

from __future__ import annotations

from minify_contract.models import Bisection, Culprit, CulpritState, JobState, JobStatus, OriginalState, Report

# The culprit phase's first message (the engine says it as the phase starts): the client's live
# line while it waits for the phase begins with it.
CULPRIT_STARTED = "the repro is delivered; finding the culprit"


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
