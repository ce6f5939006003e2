"""The engine: minify one program, offline or inside an RQ job, as a list of phases (docs/internals.md).

`minify` gives the job its sandbox; `_Run.run` is the phases, in order, each returning the job's
`Ending` as a value, or None for the next phase to run:

- `prepare`: the program is loaded in a sandbox child (a bad upload ends the job here; one that
  the file alone shows is bad, `Representation.refusal`, ends it before the sandbox starts).
- `reproduce_and_reduce`: the original, compiled once and run 3 times (target signature,
  flakiness, calibrated timeout), while the reduction runs with the strategies (scheduler, sandbox
  children), judged against the first candidate failure until the original's is known; a verdict
  that contradicts the guess starts it over, one that does not reproduce ends the job.
- `shrink`: the minimal program's inputs (the representation's `shrink`, same scheduler).
- `deliver`: the result verified, its artifacts, report.json and the bundle written (delivery.py);
  a result that something follows goes out before it.
- `original_verdict`: where the spec says which failure is meant and a candidate showed it, the
  original's verdict follows the result (deliver first, confirm after).
- `culprit`: the culprit phase follows the result (result first, the culprit after).

The job's time is `budget.Budget`'s, the delivery `delivery.Delivery`'s. User errors (a bad
upload, a program that does not fail) come back as results, never raised.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from minify_contract.models import JobSpec, JobState, Milestone, ProgressEvent
from minify_contract.summaries import CULPRIT_STARTED
from minify_worker import programs
from minify_worker.engine import artifacts
from minify_worker.engine.budget import Budget
from minify_worker.engine.delivery import Delivery, Ending, MinifyResult, culprit_follows, verdict_follows
from minify_worker.engine.evaluator import SandboxEvaluator, in_sandbox
from minify_worker.engine.hang import HangCalibration
from minify_worker.engine.original import OriginalRun
from minify_worker.engine.progress import Progress
from minify_worker.engine.report import RunFacts
from minify_worker.engine.scheduler import Scheduler
from minify_worker.engine.verdict import Unreproduced
from minify_worker.engine.workdirs import make_job_dir
from minify_worker.outcomes import Stopped
from minify_worker.programs.prepared import ProgramError
from minify_worker.sandbox import PrepareStopped, SandboxError, SandboxPool, prepare_program

log = logging.getLogger(__name__)


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
    the culprit phase runs.

    The job's sandbox lives here, in a work directory of its own, and a sandbox that fails (none
    could start, or its fork server died: no candidate can run any more) fails the job here."""
    run = _Run(spec, Path(program), None if inputs is None else Path(inputs), Path(out_dir).resolve(), on_event,
               cancel or threading.Event(), hang or HangCalibration(), on_result, on_update)
    run.out_dir.mkdir(parents=True, exist_ok=True)
    run.progress.say(Milestone.preparing, f"preparing {run.program_path.name}")
    refused = run.program.refusal(run.program_path)  # told from the file alone: no sandbox for it
    if refused is not None:
        return run.delivery.finish(Ending(JobState.failed, refused))
    workdir = make_job_dir()
    try:
        return in_sandbox(workdir, spec, run.budget.parallelism, lambda pool: run.run(pool, workdir))
    except SandboxError as error:
        if run.facts.sandbox_start is None:
            return run.delivery.finish(Ending(JobState.failed, f"cannot start the sandbox: {error}"))
        log.error("sandbox failed: %s", error)
        return run.delivery.finish(Ending(JobState.failed, f"the sandbox failed: {error}"))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


class _Run:
    """One job's phases, over what they share: the facts (report.py), the progress, the budget,
    the original's runs (original.py) and the delivery."""

    def __init__(self, spec: JobSpec, program_path: Path, inputs: Path | None, out_dir: Path,
                 on_event: Callable[[ProgressEvent], None] | None, cancel: threading.Event, hang: HangCalibration,
                 on_result: Callable[[MinifyResult], None] | None,
                 on_update: Callable[[MinifyResult], None] | None) -> None:
        self.spec = spec
        self.program_path = program_path
        self.inputs = inputs
        self.program = programs.of_format(spec.program_format)
        self.out_dir = out_dir
        self.facts = RunFacts(spec, self.program, torch.__version__)  # what report.json says (report.py)
        self.progress = Progress(self.facts, on_event)  # its clock starts the job's
        self.budget = Budget(spec, self.progress.started, cancel)
        self.original = OriginalRun(spec, self.facts, hang, say=self.progress.say, remaining=self.budget.remaining,
                                    stop_reason=self.budget.stop_reason,
                                    reduce_phase=self.progress.reduction_begins)
        self.delivery = Delivery(spec, self.program, out_dir, self.facts, self.progress, self.original, cancel,
                                 on_result=on_result, on_update=on_update)
        # What `prepare` leaves to the phases after it: the program as prepared, and the sandbox's
        # view for candidates and the scheduler over it.
        self.graph: Any = None
        self.evaluator: SandboxEvaluator
        self.scheduler: Scheduler

    def run(self, pool: SandboxPool, workdir: Path) -> MinifyResult:
        """The phases, in order, with the sandbox `pool`: the first to return an ending ends the
        search (none does: the result as found); the ending is delivered, and what the delivered
        result says follows it runs."""
        ending = self.prepare(pool, workdir)
        if ending is not None:
            return self.delivery.finish(ending)
        try:
            ending = self.reproduce_and_reduce() or self.shrink() or Ending(JobState.succeeded)  # the result as found
            result = self.deliver(ending)
            result = self.original_verdict(result)
            return self.culprit(result)
        finally:
            self.evaluator.close()

    def prepare(self, pool: SandboxPool, workdir: Path) -> Ending | None:
        """The untrusted program is loaded in a child; this process reads back JSON and tensors
        only. The evaluator and the scheduler the next phases use are set up over `pool`."""
        self.facts.sandbox_start = pool.start_method
        try:
            prepared = prepare_program(self.program_path, self.inputs, workdir, self.spec,
                                       timeout_s=self.budget.remaining(), pool=pool,
                                       should_stop=self.budget.stop_reason, target=self.program.prepare_target)
            pool.load_values(prepared.values_path, timeout_s=self.budget.remaining())
        except ProgramError as error:
            return Ending(JobState.failed, str(error))
        except PrepareStopped as stopped:
            return Ending(self.budget.stopped_status(), str(stopped))
        self.delivery.collect_environment(pool)
        self.graph = self.program.from_wire(prepared.wire_graph)
        self.facts.nodes_original = self.program.count_ops(self.graph)
        self.facts.best = self.graph
        self.progress.record_point()
        if self.budget.cancelled:
            return Ending(JobState.cancelled, "cancelled before it started")
        parallelism = self.budget.parallelism
        self.evaluator = SandboxEvaluator(
            pool, self.original.first_timeout(),
            restart=lambda start: SandboxPool(workdir, prepared, self.spec, parallelism=parallelism, start=start),
            program=self.program,
        )
        self.evaluator.on_restart = self.facts.sandbox_started  # report.json names the server in use
        self.scheduler = Scheduler(
            self.evaluator,
            self.original.still_fails,
            parallelism=parallelism,
            on_check=self.progress.emit,
            should_stop=self.original.poll,
            program=self.program,
        )
        self.progress.stats = self.scheduler.stats
        return None

    def reproduce_and_reduce(self) -> Ending | None:
        """Run the original, and reduce at once: candidates run while the original does, judged
        against the first candidate failure until the original's own is known
        (`OriginalRun.still_fails`); if the original turns out to fail otherwise, the reduction
        starts over (`verdict.Restart`). A result that goes out before the verdict goes out on a
        candidate's proof (`OriginalRun.take_proof`)."""
        self.progress.enter("reproduce")
        self.original.start(self.evaluator, self.scheduler, self.graph)
        passes = self.program.passes()
        try:
            while (verdict := self.original.reduce(passes, on_accept=self.progress.accepted)) is not None:
                if isinstance(verdict, Unreproduced):
                    return Ending.unreproduced(verdict)
                self.progress.restarted(self.graph, verdict.reason)  # `verdict.Restart`
            if self.facts.signature is None:  # the verdict is out, or contradicted a candidate's proof
                unproved = self.original.take_proof(self.facts.best)
                if unproved is not None:
                    return Ending.unreproduced(unproved)
        except Stopped as stopped:
            if self.facts.signature is None and not self.original.adopt_proof(self.facts.best):
                # Stopped before the original's outcome was known, and no candidate proved the failure.
                self.original.cancel()
                return Ending(self.budget.stopped_status(), stopped.reason)
            ending = self.budget.when_stopped(stopped.reason, caveat=self.original.unheld_hang())
            self.original.stop(cancel=ending.status is JobState.cancelled)  # no time is left for its verdict
            return ending
        return None

    def shrink(self) -> Ending | None:
        """The shrink phase, unless the spec turns it off: the representation shrinks the minimal
        program's inputs while the failure holds (`Representation.shrink`)."""
        if not self.spec.shrink or self.facts.best is None:
            return None
        self.progress.enter("shrink")
        self.facts.unshrunk = self.facts.best
        try:
            self.program.shrink(self.scheduler, self.facts.best, dynamic=self.spec.dynamic,
                                on_accept=self.progress.accepted, say=self.progress.say)
        except Stopped as stopped:
            ending = self.budget.when_stopped(stopped.reason, caveat=self.original.unheld_hang())
            self.original.stop(cancel=ending.status is JobState.cancelled)  # no time is left for its verdict
            return ending
        return None

    def deliver(self, ending: Ending) -> MinifyResult:
        """A result (a succeeded ending) is verified in a fresh child where children are reused, its
        artifacts written, the job finished (delivery.py), and, where the original's verdict or the
        culprit phase follows it, handed over first. Any other ending is finished as it is."""
        if ending.status is not JobState.succeeded:
            return self.delivery.finish(ending)
        ending = replace(ending, reason=self.original.verify_in_a_fresh_child() or ending.reason)
        self.progress.enter("artifacts")
        self.progress.say(Milestone.writing_artifacts, "writing artifacts")
        try:
            written = self.delivery.write_program_artifacts(self.evaluator.live_pool(), ending)
        except artifacts.ArtifactWriteError as error:  # the disk is full: no repro to deliver
            self.original.stop()
            return self.delivery.finish(Ending(JobState.failed, str(error)))
        result = self.delivery.finish(replace(ending, written=written))
        if result.status is not JobState.succeeded:
            self.original.stop()
            return result
        self.delivery.hand_over(result)
        return result

    def original_verdict(self, delivered: MinifyResult) -> MinifyResult:
        """Deliver first, confirm after: the original's verdict on a result delivered before it
        rewrites report.json (original_state `confirmed`, or `not_reproduced` with what the original
        did: the result is kept, its reason says so plainly, repro.py's header too) and the bundle.
        A stop (a cancel, the job's timeout) or a sandbox failure ends the wait, never the job."""
        if not verdict_follows(delivered):
            return delivered
        self.original.wait_for_verdict()
        return self.delivery.after_verdict(delivered)

    def culprit(self, delivered: MinifyResult) -> MinifyResult:
        """The culprit phase (`Representation.culprit`), after the result was delivered: its finding
        rewrites report.json, repro.py's header and the bundle; it never fails the succeeded job."""
        if not culprit_follows(delivered):
            return delivered
        assert self.facts.best is not None and self.facts.signature is not None
        started = time.monotonic()
        self.progress.phase = "culprit"  # after "done": its own clock, not the phase clock's
        self.progress.say(Milestone.culprit_started, CULPRIT_STARTED)
        phase = self.program.culprit
        assert phase is not None
        report, state = phase.after_result(
            self.evaluator, delivered.report, self.out_dir, original=self.original.graph, minimal=self.facts.best,
            target=self.facts.signature, spec=self.spec,
            timeout_s=self.facts.candidate_timeout_s or self.original.first_timeout(),
            budget=phase.budget_s(delivered.report.elapsed_s), should_stop=self.budget.stop_reason,
            say=lambda message: self.progress.say(Milestone.culprit_step, message))
        self.facts.phase_s["culprit"] = round(time.monotonic() - started, 3)
        self.progress.phase = "done"
        return self.delivery.after_culprit(delivered, report, state)
