"""What a job hands out, and how: its ending (`Ending`), the result (`MinifyResult`), and the
delivery (`Delivery`): the program's artifacts (a sandbox call), report.json, the bundle, the
final event, and the rewrites when the original's verdict or the culprit phase follows a result.

A succeeded result says in its report what follows it (`verdict_follows`, `culprit_follows`):
report.json's `original_state: running` (deliver first, confirm after) and `culprit_state:
running` with the pending reason and repro.py's pending header line (result first, the culprit
after). Such a result goes to `on_result` before what follows runs; a result the verdict rewrites
goes to `on_update`. A subscriber that raises never breaks the job.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from minify_contract.models import CulpritState, JobSpec, JobState, Milestone, OriginalState, Report
from minify_contract.summaries import culprit_summary
from minify_worker import environment
from minify_worker.engine import artifacts
from minify_worker.engine.original import OriginalRun
from minify_worker.engine.progress import Progress
from minify_worker.engine.report import RunFacts, after_verdict, build_report
from minify_worker.engine.verdict import Unreproduced
from minify_worker.outcomes import Signature
from minify_worker.programs import Representation, culprit
from minify_worker.sandbox import SandboxPool

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ending:
    """How a job ends: `status` and why (`reason`). `seen`: a failure of the original that the job
    did not take (another signature than the spec's, another kind): report.json's
    `signature_chain` is its chain, which says where it came from (a compiler's wrapper) where the
    reason names only the root cause. `cut_short`: a stop (the job's timeout) ended the search
    early, so no culprit phase follows the result. `written`: the program's artifacts, once written."""

    status: JobState
    reason: str | None = None
    seen: Signature | None = None
    cut_short: bool = False
    written: dict[str, Path] = field(default_factory=dict)

    @classmethod
    def unreproduced(cls, verdict: Unreproduced) -> Ending:
        """The original's verdict ends the job (`verdict.Unreproduced`)."""
        return cls(verdict.status, verdict.reason, seen=verdict.seen)


@dataclass
class MinifyResult:
    status: JobState
    reason: str | None
    report: Report
    artifacts: dict[str, Path] = field(default_factory=dict)


def verdict_follows(result: MinifyResult) -> bool:
    """Whether the original's verdict follows the delivered `result` (deliver first, confirm after)."""
    return result.status is JobState.succeeded and result.report.original_state is OriginalState.running


def culprit_follows(result: MinifyResult) -> bool:
    """Whether the culprit phase follows the delivered `result` (result first, the culprit after)."""
    return result.status is JobState.succeeded and result.report.culprit_state is CulpritState.running


class Delivery:
    """One job's delivery into `out_dir`, from the run's facts (see the module's doc)."""

    def __init__(self, spec: JobSpec, program: Representation, out_dir: Path, facts: RunFacts, progress: Progress,
                 original: OriginalRun, cancel: threading.Event, *,
                 on_result: Callable[[MinifyResult], None] | None = None,
                 on_update: Callable[[MinifyResult], None] | None = None) -> None:
        self.spec = spec
        self.program = program
        self.out_dir = out_dir
        self.facts = facts
        self.progress = progress
        self.original = original
        self.cancel = cancel
        self.on_result = on_result
        self.on_update = on_update
        self._environment_call: Future[dict] | None = None  # `environment.collect_in_child`, beside the original

    def collect_environment(self, pool: SandboxPool) -> None:
        """Ask a child for the worker's environment (report.json, repro.py) while the job goes on."""
        self._environment_call = pool.submit_call(environment.CALL_TARGET, timeout_s=environment.CALL_TIMEOUT_S,
                                                  purpose="environment")

    def environment(self) -> dict[str, str]:
        """The worker's environment (report.json, repro.py): the sandbox call's result, once; a
        cancelled job ends at once instead of waiting for it."""
        if not self.facts.environment:
            stopped = "the job was cancelled" if self.cancel.is_set() else None
            self.facts.environment = environment.collected(self._environment_call, stopped=stopped)
        return self.facts.environment

    def culprit_pending(self, ending: Ending) -> bool:
        """Whether the culprit phase follows the delivery of `ending`: a result the job was not cut
        short for, of a program that has a phase (`Representation.culprit`) the spec asks for. Its
        report and repro.py then say the culprit is pending."""
        return (ending.status is JobState.succeeded and not ending.cut_short and self.spec.culprit
                and self.program.culprit is not None)

    def write_program_artifacts(self, pool: SandboxPool, ending: Ending) -> dict[str, Path]:
        """The representation's files for the smallest failing program (a sandbox call: repro.py,
        inputs, ...). Raises `artifacts.ArtifactWriteError` when the disk cannot hold them."""
        assert self.facts.best is not None
        result = pool.call(
            self.program.artifacts_target,
            {
                "wire_graph": self.program.to_wire(self.facts.best),
                "out_dir": str(self.out_dir),
                "spec_json": self.spec.model_dump_json(),
                "signature": asdict(self.facts.signature) if self.facts.signature else None,
                "environment": self.environment(),
                "culprit_lines": culprit.pending_header_lines() if self.culprit_pending(ending) else [],
                "hang_bound_s": self.original.hang_bound_s(),
            },
            timeout_s=max(60.0, 4 * (self.facts.candidate_timeout_s or 0)),
        )
        self.facts.artifact_errors = dict(result.get("errors") or {})
        artifacts.raise_storage_error(result)
        for name, error in self.facts.artifact_errors.items():
            log.warning("could not write %s: %s", name, error)
        return {name: self.out_dir / name for name in result.get("files", [])}

    def finish(self, ending: Ending) -> MinifyResult:
        """End the job with `ending`: report.json, the bundle (when there are files to bundle), the
        final event. A disk that cannot hold report.json fails the job: nothing follows it then."""
        self.progress.enter("done")
        self.environment()
        if ending.status is not JobState.succeeded and self.facts.original_state is OriginalState.running:
            self.original.mark_stopped()  # the sandbox's end stops its run (evaluator.close)
        self.facts.hang_confirm_timeout_s = self.original.hang_watch.confirm_timeout_s
        pending = self.culprit_pending(ending)
        report = build_report(ending.status, ending.reason, self.facts, stats=self.progress.stats,
                              elapsed_s=self.progress.elapsed_s(),
                              culprit_fields=culprit.pending_fields() if pending else self._no_culprit(),
                              seen=ending.seen)
        status, reason = report.status, report.reason
        files = {name: path for name, path in ending.written.items() if path.is_file()}
        report.artifacts = sorted([*files, "report.json"] + (["bundle.tar.gz"] if files else []))
        try:
            files["report.json"] = artifacts.write_report(report, self.out_dir)
            if len(files) > 1:
                files["bundle.tar.gz"] = artifacts.write_bundle(self.out_dir)
        except artifacts.ArtifactWriteError as error:  # the disk is full: the job cannot deliver
            status, reason = JobState.failed, f"{reason}; {error}" if reason else str(error)
            files = {name: path for name, path in files.items() if path.is_file()}
            report = report.model_copy(update={"status": status, "reason": reason, "graph_shape_hash": None,
                                               "bug": None, "artifacts": sorted(files), **self._no_culprit()})
        self.progress.emit(force=True, status=status, milestone=Milestone.finished, message=reason or status.value,
                           culprit_state=CulpritState.running if pending and status is JobState.succeeded else None)
        return MinifyResult(status, reason, report, files)

    def hand_over(self, result: MinifyResult) -> None:
        """A result that something follows goes to `on_result` now, before what follows runs."""
        if not (verdict_follows(result) or culprit_follows(result)) or self.on_result is None:
            return
        try:
            self.on_result(result)
        except Exception:  # the delivery's own failure is the caller's to report; what follows still runs
            log.exception("delivering the result failed")

    def after_verdict(self, delivered: MinifyResult) -> MinifyResult:
        """The original's verdict (or the end of its wait) on a result delivered before it rewrites
        report.json (`report.after_verdict`), repro.py's header (an `Original:` line unless
        confirmed) and the bundle, is told as an event, and goes to `on_update`."""
        report = after_verdict(delivered.report, self.facts)
        lines = ([f"Original:         {report.original_state.value}: {self.facts.original_verdict}"]
                 if report.original_state is not OriginalState.confirmed else [])
        try:
            artifacts.rewrite_with_header_lines(self.out_dir, report, lines)
        except (OSError, artifacts.ArtifactWriteError) as error:
            log.warning("could not rewrite the artifacts with the original's verdict: %s", error)
        state = report.original_state
        if state is OriginalState.confirmed:
            self.progress.say(Milestone.original_confirmed, f"the original's verdict: confirmed "
                              f"({self.facts.original_failures} of {self.facts.original_runs} runs failed)")
        else:  # not reproduced: a milestone; stopped or lost: no verdict to mark
            self.progress.emit(force=True, milestone=Milestone.original_not_reproduced
                               if state is OriginalState.not_reproduced else None,
                               message=f"the original's verdict: {state.value}: {self.facts.original_verdict}; "
                                       "the result is kept")
        result = MinifyResult(delivered.status, report.reason, report, dict(delivered.artifacts))
        if self.on_update is not None:
            try:
                self.on_update(result)
            except Exception:  # a broken subscriber must not break the job
                log.exception("updating the delivered result failed")
        return result

    def after_culprit(self, delivered: MinifyResult, report: Report, state: CulpritState) -> MinifyResult:
        """The culprit phase rewrote report.json, repro.py's header and the bundle into `report`:
        the phases' seconds go with it, and a `culprit` event says what it found."""
        report = report.model_copy(update={"phase_s": dict(self.facts.phase_s)})
        self.progress.emit(force=True, culprit_state=state, milestone=Milestone.culprit_ended,
                           message=culprit_summary(report) or report.culprit_reason or state.value)
        return MinifyResult(delivered.status, delivered.reason, report, dict(delivered.artifacts))

    def _no_culprit(self) -> dict[str, Any]:
        """report.json's culprit fields when no phase follows the delivery."""
        return culprit.report_fields(None, self.spec, has_phase=self.program.culprit is not None)
