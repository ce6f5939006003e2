"""report.json from what a run knows when it ends: a pure function of values (`build_report`).

The engine collects the facts (`RunFacts`) as the job goes; this module decides what the report
says of them: the counts, the signature and its chain, the flaky warning, what was compiled and
run of the original, the minimal program's code, input shapes and bug key (only for a result),
and the culprit phase's fields. Writing the file is artifacts' business.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from minify_contract.bugs import bug_key
from minify_contract.models import JobSpec, JobState, OriginalState, Report, TimelinePoint
from minify_worker.engine.scheduler import Stats
from minify_worker.outcomes import Signature
from minify_worker.programs import Representation


@dataclass
class RunFacts:
    """What one run knows about itself; the engine fills it in as the job goes."""

    spec: JobSpec
    program: Representation
    torch_version: str
    nodes_original: int | None = None
    best: Any = None  # the smallest failing program so far (the representation's)
    unshrunk: Any = None  # the minimal program the shrink phase started from
    signature: Signature | None = None  # the original's, once known
    flaky: bool = False
    original_compiles: int = 0
    original_runs: int = 0
    original_failures: int = 0
    candidate_timeout_s: float | None = None
    hang_confirm_timeout_s: float | None = None
    sandbox_start: str | None = None
    timeline: list[TimelinePoint] = field(default_factory=list)
    phase_s: dict[str, float] = field(default_factory=dict)
    artifact_errors: dict[str, str] = field(default_factory=dict)
    environment: dict[str, str] = field(default_factory=dict)
    original_state: OriginalState | None = None  # where the original's verdict stands
    original_verdict: str | None = None  # what the original did, when it did not fail the wanted way
    original_output: str | None = None  # what it printed and raised then (`target.original_output`)
    next_step: str | None = None  # what to try, when the job ends not reproducible (`target.next_step`)

    def sandbox_started(self, pool: Any) -> None:
        """A sandbox pool replaced the job's first (the evaluator's restart): how the one in use started."""
        self.sandbox_start = pool.start_method


def flaky_reason(facts: RunFacts) -> str:
    return (f"flaky: the original failed in {facts.original_failures} of {facts.original_runs} runs, so a "
            "candidate that passed once may fail on another run; the result may not be minimal")


def contradiction_reason(facts: RunFacts) -> str:
    """What a succeeded job says when the original's verdict contradicts its result."""
    return (f"the result is kept, though the original's verdict contradicts it: {facts.original_verdict}; the "
            f"minimal program fails with {facts.signature}, the failure the spec names, so it is a repro of that bug")


def original_fields(facts: RunFacts) -> dict[str, Any]:
    """report.json's fields of the original's runs and verdict, as `facts` know them now."""
    return {"original_state": facts.original_state, "original_verdict": facts.original_verdict,
            "flaky": facts.flaky, "original_compiles": facts.original_compiles, "original_runs": facts.original_runs,
            "original_failures": facts.original_failures, "original_output": facts.original_output,
            "next_step": facts.next_step}


def after_verdict(delivered: Report, facts: RunFacts) -> Report:
    """The delivered report once the original's verdict followed it (or its wait ended): the
    original's fields, and a reason that says plainly when the verdict contradicts the result or
    the original was flaky; everything else as delivered."""
    reason = delivered.reason
    if facts.original_state is OriginalState.not_reproduced:
        reason = f"{reason}; {contradiction_reason(facts)}" if reason else contradiction_reason(facts)
    elif facts.original_state is OriginalState.confirmed and facts.flaky and reason is None:
        reason = flaky_reason(facts)
    return delivered.model_copy(update={**original_fields(facts), "reason": reason,
                                        "phase_s": dict(facts.phase_s)})


def build_report(status: JobState, reason: str | None, facts: RunFacts, *, stats: Stats | None, elapsed_s: float,
                 culprit_fields: dict[str, Any], seen: Signature | None = None) -> Report:
    """The report of a run that ended with `status`. `seen`: a failure of the original the job did
    not take (another signature than the spec's, another kind): `signature_chain` is its chain,
    which says where it came from (a compiler's wrapper) where the reason names only the root cause.
    A succeeded run's report describes its minimal program and files it under a bug."""
    if status is JobState.succeeded and facts.original_state is OriginalState.not_reproduced:
        reason = f"{reason}; {contradiction_reason(facts)}" if reason else contradiction_reason(facts)
    if status is JobState.succeeded and facts.flaky and reason is None:
        reason = flaky_reason(facts)
    best, program, spec = facts.best, facts.program, facts.spec
    succeeded = best is not None and status is JobState.succeeded
    chained = facts.signature or seen
    report = Report(
        status=status,
        reason=reason,
        nodes_original=facts.nodes_original,
        nodes_final=program.count_ops(best) if succeeded else None,
        checks_total=stats.checks_total if stats else 0,
        checks_cached=stats.checks_cached if stats else 0,
        elapsed_s=round(elapsed_s, 3),
        signature=str(facts.signature) if facts.signature else None,
        failure_kind=facts.signature.kind if facts.signature else None,
        signature_chain=list(chained.chain) if chained else [],
        **original_fields(facts),
        candidate_timeout_s=facts.candidate_timeout_s,
        hang_confirm_timeout_s=facts.hang_confirm_timeout_s,
        backend=spec.backend,
        device=spec.device,
        config=spec.config,
        torch_version=facts.torch_version,
        environment=facts.environment,
        outcomes=dict(stats.outcomes) if stats else {},
        timeline=facts.timeline,
        graph_code=program.code(best) if succeeded else None,
        artifact_errors=facts.artifact_errors,
        phase_s=facts.phase_s,
        sandbox_start=facts.sandbox_start,
        input_shapes_original=program.input_shapes(facts.unshrunk or best) if succeeded else {},
        input_shapes_final=program.input_shapes(best) if succeeded else {},
        **culprit_fields,
    )
    if succeeded:
        report.graph_shape_hash = program.shape_hash(best)
        report.bug = bug_key(report.signature, report.graph_shape_hash) if report.signature else None
    return report
