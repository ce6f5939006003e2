"""The engine's entry point: minify one program, offline or inside an RQ job (docs/internals.md).

prepare (sandbox child) → reproduce the original, compiled once and run 3 times (target signature,
flakiness, calibrated timeout), while the reduction starts, judging against the first candidate
failure until the original's is known → reduce with the strategies (scheduler, sandbox children)
→ shrink the inputs of the minimal graph (the representation's `shrink`, same scheduler) → artifacts. Where the spec
says which failure is meant (its signature, or an accuracy failure) and a candidate showed it, the
result goes out before the original's verdict, which follows it (deliver first, confirm after).
User errors (a bad upload, a program that does not fail) come back as results, never raised.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from minify_contract.models import CulpritState, JobSpec, JobState, Milestone, OriginalState, ProgressEvent, Report
from minify_contract.summaries import culprit_summary
from minify_worker import environment, programs
from minify_worker.engine import artifacts
from minify_worker.engine.evaluator import SandboxEvaluator, in_sandbox
from minify_worker.engine.hang import HangCalibration
from minify_worker.engine.original import OriginalRun
from minify_worker.engine.progress import Progress
from minify_worker.engine.report import RunFacts, after_verdict, build_report
from minify_worker.engine.scheduler import Scheduler, reduce
from minify_worker.engine.target import Unreproduced
from minify_worker.engine.workdirs import make_job_dir
from minify_worker.outcomes import Signature, Stopped
from minify_worker.programs import culprit
from minify_worker.programs.candidates import StrategyContext
from minify_worker.programs.prepared import ProgramError
from minify_worker.sandbox import (
    PrepareStopped,
    SandboxError,
    SandboxPool,
    prepare_program,
)

log = logging.getLogger(__name__)



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
    hang: HangCalibration | None = None,
    on_result: Callable[[MinifyResult], None] | None = None,
    on_update: Callable[[MinifyResult], None] | None = None,
) -> MinifyResult:
    """Minify `program`; user errors come back as a `failed`/`not_reproducible` result, never raised.
    `hang`: how a hang is told when the spec gives no timeout (`HangCalibration`; tests scale it).

    Result first, the culprit follows: a succeeded job's artifacts are written, and its result
    handed to `on_result` (report.json's culprit_state `running`), before the culprit phase runs;
    the phase then rewrites report.json, repro.py's header and the bundle, emits a `culprit` event,
    and the result returned is the final one. A cancel during the phase stops the phase only.

    Deliver first, confirm after: where the spec says which failure is meant and a candidate showed
    it, the result is handed to `on_result` before the original's verdict (report.json's
    original_state `running`); the verdict then rewrites report.json (`confirmed`, or
    `not_reproduced` with what the original did, the result kept) and goes to `on_update`, before
    the culprit phase runs."""
    run = _Run(spec, Path(out_dir).resolve(), on_event, cancel or threading.Event(), hang or HangCalibration(),
               on_result, on_update)
    return run.execute(Path(program), None if inputs is None else Path(inputs))


def default_parallelism(spec: JobSpec) -> int:
    """What the device can hold: one child per core on CPU; a few per GPU (they share its memory)."""
    if spec.limits.parallelism:
        return spec.limits.parallelism
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, 4 if spec.device_class == "cuda" else 16))


class _Run:
    def __init__(self, spec: JobSpec, out_dir: Path, on_event: Callable[[ProgressEvent], None] | None,
                 cancel: threading.Event, hang: HangCalibration,
                 on_result: Callable[[MinifyResult], None] | None = None,
                 on_update: Callable[[MinifyResult], None] | None = None) -> None:
        self.spec = spec
        self.program = programs.of_format(spec.program_format)
        self.on_result = on_result
        self.on_update = on_update
        self.out_dir = out_dir
        self.cancel = cancel
        self.scheduler: Scheduler | None = None
        self.facts = RunFacts(spec, self.program, torch.__version__)  # what report.json says (report.py)
        self.progress = Progress(self.facts, on_event)  # its clock starts the job's
        self.deadline = self.progress.started + spec.limits.job_timeout_s
        self._culprit_pending = False  # the delivered result says the culprit phase follows
        self._environment_call: Future[dict] | None = None  # `environment.collect_in_child`, beside the original
        self.original = OriginalRun(spec, self.facts, hang, say=self.progress.say, remaining=self._remaining,
                                    stop_reason=self._stop_reason, reduce_phase=self._reduce_phase)

    # -- the run ---------------------------------------------------------------------------

    def execute(self, program: Path, inputs: Path | None) -> MinifyResult:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        workdir = make_job_dir()
        try:
            return self._execute(program, inputs, workdir)
        except SandboxError as error:  # the fork server itself died: no candidate can run any more
            log.error("sandbox failed: %s", error)
            return self._finish(JobState.failed, f"the sandbox failed: {error}")
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _execute(self, program: Path, inputs: Path | None, workdir: Path) -> MinifyResult:
        self.progress.say(Milestone.preparing, f"preparing {program.name}")
        parallelism = default_parallelism(self.spec)
        try:
            return in_sandbox(workdir, self.spec, parallelism,
                              lambda pool: self._execute_in(pool, program, inputs, workdir, parallelism))
        except SandboxError as error:
            if self.facts.sandbox_start is None:
                return self._finish(JobState.failed, f"cannot start the sandbox: {error}")
            raise

    def _execute_in(self, pool: SandboxPool, program: Path, inputs: Path | None, workdir: Path,
                    parallelism: int) -> MinifyResult:
        self.facts.sandbox_start = pool.start_method
        try:
            # The untrusted program is loaded in a child; this process reads back JSON and tensors only.
            prepared = prepare_program(program, inputs, workdir, self.spec, timeout_s=self._remaining(), pool=pool,
                                       should_stop=self._stop_reason, target=self.program.prepare_target)
            pool.load_values(prepared.values_path, timeout_s=self._remaining())
        except ProgramError as error:
            return self._finish(JobState.failed, str(error))
        except PrepareStopped as stopped:
            return self._finish(JobState.cancelled if self.cancel.is_set() else JobState.failed, str(stopped))
        self._environment_call = pool.submit_call(environment.CALL_TARGET, timeout_s=environment.CALL_TIMEOUT_S,
                                                  purpose="environment")
        graph = self.program.from_wire(prepared.wire_graph)
        self.facts.nodes_original = self.program.count_ops(graph)
        self.facts.best = graph
        self.progress.record_point()
        if self.cancel.is_set():
            return self._finish(JobState.cancelled, "cancelled before it started")
        evaluator = SandboxEvaluator(
            pool, self.original.first_timeout(),
            restart=lambda start: SandboxPool(workdir, prepared, self.spec, parallelism=parallelism, start=start),
            program=self.program,
        )
        self.scheduler = Scheduler(
            evaluator,
            self.original.still_fails,
            parallelism=parallelism,
            on_check=self.progress.emit,
            should_stop=self.original.poll,
            program=self.program,
        )
        self.progress.stats = self.scheduler.stats
        try:
            return self._reproduce_and_reduce(evaluator, graph)
        finally:
            evaluator.close()

    def _reproduce_and_reduce(self, evaluator: SandboxEvaluator, graph: Any) -> MinifyResult:
        """Run the original, and reduce at once: candidates run while the original does, judged
        against the first candidate failure until the original's own is known (`_still_fails`);
        if the original turns out to fail otherwise, the reduction starts over (`target.Restart`)."""
        self.progress.enter("reproduce")
        self.original.start(evaluator, self.scheduler, graph)
        status, reason = JobState.succeeded, None
        stopped_early = False
        try:
            while True:
                try:
                    reduce(self.scheduler, graph, self._context(), self.program.passes(),
                           on_accept=self._accepted)
                    if not self.original.defers_verdict(self.facts.best):
                        self.original.settle()  # a graph that offered no candidate at all never asked for it
                except Stopped:
                    if self.original.ending is None:
                        raise
                ending, self.original.ending = self.original.ending, None
                if isinstance(ending, Unreproduced):
                    return self._finish(ending.status, ending.reason, seen=ending.seen)
                if ending is None:
                    break
                self.facts.best = graph
                self.progress.record_point()
                self.progress.emit(force=True, graph=graph, milestone=Milestone.restarted, message=ending.reason)
            if self.facts.signature is None:  # the verdict is out, or contradicted a candidate's proof
                if not self.original.adopt_proof(self.facts.best):
                    # The original's verdict contradicts the proof, and no smaller program fails so.
                    unreproduced = self.original.contradiction
                    assert unreproduced is not None
                    return self._finish(unreproduced.status, unreproduced.reason, seen=unreproduced.seen)
                # The result goes out on a candidate's proof: the failure must still depend on the program.
                empty = self.original.empty_fails_like_proof()
                if empty is not None:
                    self._stop_original()
                    return self._finish(JobState.failed, empty)
            self._shrink_inputs()
        except Stopped as stopped:
            # Stopped before the original's outcome was known, and no candidate proved the failure.
            if self.facts.signature is None and not self.original.adopt_proof(self.facts.best):
                self.original.cancel()
                return self._finish(JobState.cancelled if self.cancel.is_set() else JobState.failed, stopped.reason)
            status, reason = self._status_when_stopped(stopped.reason)
            stopped_early = True
            self._stop_original()  # no time is left for its verdict
        if status is JobState.cancelled:
            self._stop_original()
            self.original.cancel()
            return self._finish(status, reason)
        reason = self.original.verify_in_a_fresh_child() or reason
        self.progress.enter("artifacts")
        self.progress.say(Milestone.writing_artifacts, "writing artifacts")
        # The culprit phase follows the delivered result, unless the job was cut short (a stop); so
        # does the original's verdict where the result went out before it.
        follows = (self.spec.culprit and self.program.culprit is not None
                   and status is JobState.succeeded and not stopped_early)
        self._culprit_pending = follows
        try:
            written = self._write_program_artifacts(evaluator.live_pool())
        except artifacts.ArtifactWriteError as error:  # the disk is full: no repro to deliver
            self._culprit_pending = False
            self._stop_original()
            return self._finish(JobState.failed, str(error))
        result = self._finish(status, reason, written)
        verdict_follows = self.facts.original_state is OriginalState.running
        if result.status is not JobState.succeeded:
            self._stop_original()
            return result
        if not follows and not verdict_follows:
            return result
        if self.on_result is not None:
            try:
                self.on_result(result)
            except Exception:  # the delivery's own failure is the caller's to report; what follows still runs
                log.exception("delivering the result failed")
        if verdict_follows:
            result = self._original_verdict(result)
        return self._culprit_phase(evaluator, result) if follows else result

    def _original_verdict(self, delivered: MinifyResult) -> MinifyResult:
        """Deliver first, confirm after: the original's verdict on a result delivered before it
        rewrites report.json (original_state `confirmed`, or `not_reproduced` with what the original
        did: the result is kept, its reason says so plainly, repro.py's header too) and the bundle.
        A stop (a cancel, the job's timeout) or a sandbox failure ends the wait, never the job."""
        started = time.monotonic()
        self.original.delivered = True
        try:
            self.original.settle()
        except Stopped as stopped:
            self.original.cancel()
            self.facts.original_state = OriginalState.stopped
            self.facts.original_verdict = f"the wait for its verdict ended: {stopped.reason}"
        except SandboxError as error:
            self.facts.original_state = OriginalState.lost
            self.facts.original_verdict = f"the sandbox failed before its verdict: {error}"
        self.facts.phase_s["original"] = round(time.monotonic() - started, 3)
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

    def _stop_original(self) -> None:
        """No verdict will follow a result delivered without it (the job was cut short)."""
        if self.facts.original_state is OriginalState.running:
            self.original.cancel()
            self._mark_original_stopped()

    def _mark_original_stopped(self) -> None:
        self.facts.original_state = OriginalState.stopped
        self.facts.original_verdict = "the job ended before its verdict"

    def _reduce_phase(self) -> None:
        """The original's verdict came while candidates were judged against the guess: the
        reduction proper begins (unless the verdict came in a later phase, the shrink)."""
        if self.progress.phase == "reproduce":
            self.progress.enter("reduce")

    def _culprit_phase(self, evaluator: SandboxEvaluator, delivered: MinifyResult) -> MinifyResult:
        """The culprit phase (`Representation.culprit`), after the result was delivered: its finding rewrites
        report.json, repro.py's header and the bundle; it never fails the succeeded job."""
        assert self.facts.best is not None and self.facts.signature is not None
        started = time.monotonic()
        self.progress.phase = "culprit"  # after "done": its own clock, not the phase clock's
        self.progress.say(Milestone.culprit_started, "the repro is delivered; finding the culprit")
        phase = self.program.culprit
        assert phase is not None
        report, state = phase.after_result(
            evaluator, delivered.report, self.out_dir, original=self.original.graph, minimal=self.facts.best,
            target=self.facts.signature, spec=self.spec,
            timeout_s=self.facts.candidate_timeout_s or self.original.first_timeout(),
            budget=phase.budget_s(delivered.report.elapsed_s), should_stop=self._stop_reason,
            say=lambda message: self.progress.say(Milestone.culprit_step, message))
        self.facts.phase_s["culprit"] = round(time.monotonic() - started, 3)
        self.progress.phase = "done"
        report = report.model_copy(update={"phase_s": dict(self.facts.phase_s)})
        self.progress.emit(force=True, culprit_state=state, milestone=Milestone.culprit_ended,
                           message=culprit_summary(report) or report.culprit_reason or state.value)
        return MinifyResult(delivered.status, delivered.reason, report, dict(delivered.artifacts))

    def _shrink_inputs(self) -> None:
        """The shrink phase, unless the spec turns it off: the representation shrinks the minimal
        program's inputs while the failure holds (`Representation.shrink`)."""
        if not self.spec.shrink or self.facts.best is None:
            return
        assert self.scheduler is not None
        self.progress.enter("shrink")
        self.facts.unshrunk = self.facts.best
        self.program.shrink(self.scheduler, self.facts.best, dynamic=self.spec.dynamic, on_accept=self._accepted,
                say=self.progress.say)

    def _context(self) -> StrategyContext:
        return StrategyContext.for_failure(self.spec.failure.kind)

    def _accepted(self, graph: Any, description: str) -> None:
        self.facts.best = graph
        self.progress.record_point()
        self.progress.emit(force=True, graph=graph, milestone=Milestone.accepted, message=description)

    def _write_program_artifacts(self, pool: SandboxPool) -> dict[str, Path]:
        assert self.facts.best is not None
        result = pool.call(
            self.program.artifacts_target,
            {
                "wire_graph": self.program.to_wire(self.facts.best),
                "out_dir": str(self.out_dir),
                "spec_json": self.spec.model_dump_json(),
                "signature": asdict(self.facts.signature) if self.facts.signature else None,
                "environment": self._environment(),
                "culprit_lines": culprit.pending_header_lines() if self._culprit_pending else [],
            },
            timeout_s=max(60.0, 4 * (self.facts.candidate_timeout_s or 0)),
        )
        self.facts.artifact_errors = dict(result.get("errors") or {})
        artifacts.raise_storage_error(result)
        for name, error in self.facts.artifact_errors.items():
            log.warning("could not write %s: %s", name, error)
        return {name: self.out_dir / name for name in result.get("files", [])}

    # -- ending ----------------------------------------------------------------------------

    def _environment(self) -> dict[str, str]:
        """The worker's environment (report.json, repro.py): the sandbox call's result, once; a
        cancelled job ends at once instead of waiting for it."""
        if not self.facts.environment:
            stopped = "the job was cancelled" if self.cancel.is_set() else None
            self.facts.environment = environment.collected(self._environment_call, stopped=stopped)
        return self.facts.environment

    def _finish(self, status: JobState, reason: str | None, written: dict[str, Path] | None = None, *,
                seen: Signature | None = None) -> MinifyResult:
        """End the job with `status`. `seen`: a failure of the original that the job did not take
        (another signature than the spec's, another kind): report.json's `signature_chain` is its
        chain, which says where it came from (a compiler's wrapper) where the reason names only the
        root cause."""
        self.progress.enter("done")
        self._environment()
        if status is not JobState.succeeded and self.facts.original_state is OriginalState.running:
            self._mark_original_stopped()  # the sandbox's end stops its run (evaluator.close)
        self.facts.hang_confirm_timeout_s = self.original.hang_watch.confirm_timeout_s
        culprit_fields = (culprit.pending_fields() if self._culprit_pending and status is JobState.succeeded
                          else culprit.report_fields(None, self.spec, has_phase=self.program.culprit is not None))
        report = build_report(status, reason, self.facts, stats=self.scheduler.stats if self.scheduler else None,
                              elapsed_s=self.progress.elapsed_s(), culprit_fields=culprit_fields, seen=seen)
        status, reason = report.status, report.reason
        files = {name: path for name, path in (written or {}).items() if path.is_file()}
        report.artifacts = sorted([*files, "report.json"] + (["bundle.tar.gz"] if files else []))
        try:
            files["report.json"] = artifacts.write_report(report, self.out_dir)
            if len(files) > 1:
                files["bundle.tar.gz"] = artifacts.write_bundle(self.out_dir)
        except artifacts.ArtifactWriteError as error:  # the disk is full: the job cannot deliver
            status, reason = JobState.failed, f"{reason}; {error}" if reason else str(error)
            files = {name: path for name, path in files.items() if path.is_file()}
            self._culprit_pending = False  # nothing delivered: no phase follows
            report = report.model_copy(update={"status": status, "reason": reason, "graph_shape_hash": None,
                                               "bug": None, "artifacts": sorted(files),
                                               **culprit.report_fields(None, self.spec,
                                                                       has_phase=self.program.culprit is not None)})
        self.progress.emit(force=True, status=status, milestone=Milestone.finished, message=reason or status.value,
                           culprit_state=CulpritState.running if status is JobState.succeeded and self._culprit_pending
                           else None)
        return MinifyResult(status, reason, report, files)

    def _status_when_stopped(self, reason: str) -> tuple[JobState, str]:
        if self.cancel.is_set():
            return JobState.cancelled, reason
        return JobState.succeeded, f"{reason}: the result is the smallest failing program found so far"

    def _stop_reason(self) -> str | None:
        if self.cancel.is_set():
            return "cancelled"
        if time.monotonic() > self.deadline:
            return f"job timeout of {self.spec.limits.job_timeout_s:g}s reached"
        return None

    def _remaining(self) -> float:
        return max(1.0, self.deadline - time.monotonic())
