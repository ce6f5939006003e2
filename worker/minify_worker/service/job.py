"""The RQ job entry: run the engine on one attempt of a job and keep its Redis record and event stream current.

The server enqueues `run_job(ticket)`; the ticket (ledger.JobTicket) names the program, the spec,
the result folder, the Redis keys to write and the attempt it runs (the layout, the record's
fields and their encoding are the ledger's, minify_contract/ledger.py, which the server reads
through; see docs/service.md). This module imports no torch: the RQ parent imports it for
`on_rq_failure` and `record_worker_lost`; only `run_job`, in the forked work horse, reaches the engine.

Every write goes through the attempt's `channel.JobChannel`, fenced by the attempt and riding out
Redis restarts (docs/deploy.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from redis import Redis
from redis.exceptions import RedisError
from rq import get_current_job
from rq.job import Job

from minify_contract.ledger import (
    AttemptSuperseded,
    JobTicket,
)
from minify_contract.models import CulpritState, JobSpec, JobState, OriginalState, ProgressEvent, Report
from minify_worker import programs
from minify_worker.service import joblog
from minify_worker.service.channel import (
    CANCEL_POLL_S,
    UNREACHABLE,
    AttemptFolder,
    JobChannel,
    RedisUnreachable,
    failing_fast,
    patiently,
    versions_event,
)
from minify_worker.service.versions import bisect as versions_bisect
from minify_worker.service.versions import bugs as versions_bugs
from minify_worker.service.versions import phase as versions_phase
from minify_worker.service.versions import probe as versions_probe

log = logging.getLogger(__name__)


class WorkerShutdown(Exception):
    """The worker was stopped mid-job (cold shutdown): the attempt is re-queued while retries are left."""


class _Watcher(threading.Thread):
    """Turns the Redis cancel flag, the job's deadline, a newer attempt of the job, or Redis silent
    past the patience, into the engine's cancel Event; sends the events that waited for Redis."""

    def __init__(self, channel: JobChannel, timeout_s: float) -> None:
        super().__init__(name="minify-cancel-watcher", daemon=True)
        self.channel = channel
        self.deadline = time.monotonic() + timeout_s
        self.cancel = threading.Event()
        self.cancelled = False
        self.timed_out = False
        self.interrupted = False
        self.unreachable = False
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(CANCEL_POLL_S):
            if time.monotonic() > self.deadline and not self.cancel.is_set():
                self.timed_out = True
                self.cancel.set()
            try:
                self.channel.flush()
                cancel_requested, current = self.channel.poll()
            except AttemptSuperseded:
                current, cancel_requested = False, False
            except UNREACHABLE:
                if self.channel.unreachable_for() > self.channel.patience_s and not self.cancel.is_set():
                    self.unreachable = True
                    self.cancel.set()
                continue
            except RedisError:
                continue
            if not current:
                self.channel.superseded.set()
            if self.channel.superseded.is_set():
                self.cancel.set()
            elif cancel_requested and not self.cancel.is_set():
                self.cancelled = True
                self.cancel.set()

    def interrupt(self, signum: int, frame: object) -> None:
        """SIGTERM in the work horse (the worker's cold shutdown): stop the engine, then re-queue."""
        self.interrupted = True
        self.cancel.set()
        versions_probe.stop_all()  # a version probe running after delivery would hold the horse to its timeout

    def stop(self) -> None:
        self._done.set()


@joblog.kept  # the job's own log (GET /v1/jobs/{id}/log), beside its result folder
def run_job(wire: dict[str, Any]) -> str:
    """Entry point RQ runs in the work horse, given the server's ticket (`JobTicket.to_wire`).
    Returns the final status; raises AttemptSuperseded when the attempt stopped because it was no
    longer the job's current one (nothing of it was kept)."""
    rq_job = get_current_job()
    assert rq_job is not None, "run_job runs inside an RQ work horse"
    ticket = JobTicket.from_wire(wire)
    channel = JobChannel(failing_fast(rq_job.connection), ticket.keys, ticket.job_id, ticket.attempt)
    worker = os.environ.get("RQ_WORKER_ID") or rq_job.worker_name or f"pid {os.getpid()}"
    if patiently(channel.cancel_requested, channel.patience_s):
        try:
            channel.finish(JobState.cancelled, "cancelled before it started", None, from_status=JobState.queued)
        except AttemptSuperseded:
            pass
        return JobState.cancelled.value
    if not channel.start(worker):
        status = patiently(channel.status, channel.patience_s)
        log.info("job %s: a stale queue entry (attempt %s; the job is %s): nothing to run", ticket.job_id,
                 ticket.attempt, status.value if status else "gone")
        return (status or JobState.cancelled).value
    assert channel.attempt is not None
    spec = ticket.spec
    folder = AttemptFolder(ticket.out_dir, channel.attempt)
    out_dir = folder.prepare()
    watcher = _Watcher(channel, spec.limits.job_timeout_s)
    watcher.start()
    signal.signal(signal.SIGTERM, watcher.interrupt)
    delivered: list[Report] = []
    probed_versions: list[list[str]] = []

    def finish_and_send_probes(status: JobState, reason: str | None, report: Report | None) -> Report | None:
        """The final status and result; for a succeeded job, then the version phase's probes go out
        to the workers holding other torch versions (`versions_phase.fan_out`)."""
        # Which torch has the bug: a question for torch programs only (a StableHLO job's repro needs jax).
        versions = (spec.versions and programs.of_format(spec.program_format).versions_phase
                    and status is JobState.succeeded and report is not None)
        probed: list[str] | None = None
        if versions:
            report = report.model_copy(update={"versions_state": CulpritState.running})
            own = versions_phase.offered_envs()[0]
            try:
                probed = patiently(lambda: versions_phase.versions_to_probe(channel.redis, own), channel.patience_s)
            except RedisError as error:  # no phase: the delivered result says so, not `running`
                log.warning("the version phase could not read the fleet's torch versions: %s", error)
                report = report.model_copy(update={"versions_state": CulpritState.lost})
        # The bug learns which versions the phase runs its repro on as it is filed, in one transaction:
        # the server's sweep of open bugs never finds it filed and those versions not yet asked.
        asked = [own.torch, *probed] if probed is not None else []
        channel.finish(status, reason, report, folder,
                       filed=lambda pipe, bug_record: versions_bugs.phase_asks(pipe, bug_record, asked))
        if probed is not None:
            # Rides out a Redis restart as the final writes do: fan_out starts clean and enqueues under fixed
            # ids, so a retry only sends again (a probe it had queued already is queued twice, answers twice).
            try:
                patiently(lambda: versions_phase.fan_out(channel.redis, ticket.job_id, out_dir, report, probed),
                          channel.patience_s)
                probed_versions.append(probed)
            except RedisError as error:  # no phase follows: the record's result says so now, not `running`
                log.warning("the version phase could not send its probes: %s", error)
                report = report.model_copy(update={"versions_state": CulpritState.lost})
                with contextlib.suppress(RedisError, AttemptSuperseded):
                    channel.result_updated(report)
                if report.bug and channel.keys.has_bug_index:  # the server's re-tests ask those versions again
                    with contextlib.suppress(RedisError):
                        versions_bugs.phase_answered(channel.redis, channel.keys.bug_record(report.bug), asked)
        return report

    def deliver(status: JobState, reason: str | None, report: Report) -> None:
        """The result, before the culprit phase runs: the job is succeeded, its artifacts downloadable."""
        delivered.append(finish_and_send_probes(status, reason, report))

    def update(report: Report) -> None:
        """The original's verdict after the delivered result: the record's result says it at once."""
        if delivered and delivered[0] is not None:
            updated = report.model_copy(update={"versions_state": delivered[0].versions_state})
            try:
                channel.result_updated(updated)
            except RedisError as error:  # the final write (culprit_ended) carries it too
                log.warning("could not record the original's verdict: %s", error)

    status, reason, report = _minify(channel, ticket, out_dir, watcher.cancel, deliver, update)
    watcher.stop()
    if channel.superseded.is_set() and not delivered:
        log.warning("job %s: attempt %d is no longer the job's current one (re-queued, or another attempt "
                    "runs): it stopped, and nothing of it was kept", ticket.job_id, channel.attempt)
        raise AttemptSuperseded(f"attempt {channel.attempt} of job {ticket.job_id} was superseded")
    if watcher.unreachable and not delivered:
        raise RedisUnreachable(f"Redis did not answer for {channel.patience_s:g} s: attempt {channel.attempt} "
                               f"of job {ticket.job_id} gave up")
    if delivered:
        if report is not None:  # the engine's report knows nothing of the version phase: the delivered one does
            report = report.model_copy(update={"versions_state": delivered[0].versions_state})
        # A cancel or the job's timeout stopped the culprit phase only (the engine says so); a
        # shutdown or an error lost it: the job stays succeeded either way and is never re-queued.
        if report is None or status is not JobState.succeeded:
            report = _culprit_lost(delivered[0], out_dir, f"the culprit phase ended in an error: {reason}")
        elif watcher.interrupted:
            report = _culprit_lost(report, out_dir, "the worker shut down during the culprit phase")
        if probed_versions and not watcher.interrupted:
            report = _version_phase(channel, ticket.job_id, out_dir, report, probed_versions[0])
            channel.publish(versions_event(report))
        if spec.bisect is not None and not watcher.interrupted and report.status is JobState.succeeded:
            report = _bisect(channel, out_dir, report, spec)
        channel.culprit_ended(report)
        return JobState.succeeded.value
    if watcher.interrupted:
        raise WorkerShutdown("the worker shut down mid-job")
    if watcher.timed_out:
        status, reason = JobState.failed, f"job timed out after {spec.limits.job_timeout_s:g} s (limits.job_timeout_s)"
    elif watcher.cancelled:
        status, reason = JobState.cancelled, "cancelled"
    report = finish_and_send_probes(status, reason, report)
    if probed_versions:
        # No culprit phase followed (spec culprit false): the version phase runs after the final status.
        found = _version_phase(channel, ticket.job_id, out_dir, report, probed_versions[0])
        if spec.bisect is not None:
            found = _bisect(channel, out_dir, found, spec)
        channel.versions_ended(found)
    return status.value


def _minify(channel: JobChannel, ticket: JobTicket, out_dir: Path, cancel: threading.Event,
            deliver: Callable[[JobState, str | None, Report], None],
            update: Callable[[Report], None]) -> tuple[JobState, str | None, Report | None]:
    from minify_worker import engine  # torch lives behind the engine: import it in the horse only

    def on_event(event: ProgressEvent) -> None:
        if event.type == "culprit" or (event.type == "status" and event.status is not None and event.status.finished):
            return  # published by finish() and culprit_ended(), together with the record
        try:
            channel.publish(event)
        except AttemptSuperseded:
            cancel.set()

    try:
        result = engine.minify(ticket.program, ticket.spec, out_dir, inputs=ticket.inputs, on_event=on_event,
                               cancel=cancel, on_result=lambda done: deliver(done.status, done.reason, done.report),
                               on_update=lambda updated: update(updated.report))
    except Exception as error:
        if channel.superseded.is_set():
            return JobState.failed, "the attempt was superseded", None
        log.exception("the engine raised")
        try:
            channel.log("".join(traceback.format_exception(error))[-4000:])
        except (RedisError, AttemptSuperseded):
            pass
        return JobState.failed, f"internal error: {type(error).__name__}: {error}", None
    return result.status, result.reason, result.report


def _version_phase(channel: JobChannel, job_id: str, out_dir: Path, report: Report, versions: list[str]) -> Report:
    """The probes' answers (versions_phase.collect) in report.json and repro.py's header."""
    own = versions_phase.offered_envs()[0]
    deadline = time.monotonic() + versions_phase.probe_timeout_s() + versions_phase.QUEUE_WAIT_S
    try:
        runs, stopped = versions_phase.collect(channel.redis, job_id, out_dir, report, versions, deadline,
                                               channel.cancel_requested)
        found = versions_phase.with_versions(report, [versions_phase.own_run(report, own), *runs],
                                             CulpritState.cancelled if stopped else CulpritState.done)
        versions_phase.write_findings(out_dir, found)
        if found.bug and channel.keys.has_bug_index:  # the bug learns which versions it has, and whether one fixed it
            bug_record = channel.keys.bug_record(found.bug)
            versions_bugs.record_runs(channel.redis, bug_record, job_id, found.versions, "version phase")
            versions_bugs.phase_answered(channel.redis, bug_record, [own.torch, *versions])
        return found
    except Exception:  # Redis gone, a full disk: the succeeded job stands, the phase is lost
        log.exception("the version phase failed")
        return report.model_copy(update={"versions_state": CulpritState.lost})


def _bisect(channel: JobChannel, out_dir: Path, report: Report, spec: JobSpec) -> Report:
    """The bisection the spec asks for (versions_bisect.for_job), after the version phase."""
    assert spec.bisect is not None

    try:
        return versions_bisect.for_job(out_dir, report, spec.bisect, channel.log, channel.result_updated)
    except Exception:  # Redis gone, a full disk: the succeeded job stands
        log.exception("the bisection failed")
        return report


def _culprit_lost(report: Report, out_dir: Path, why: str) -> Report:
    """The delivered result with what still ran after it marked lost (its culprit phase, its version
    phase, its original's verdict); report.json (and the bundle) rewritten
    as the phase's own end rewrites them (`artifacts.rewrite_for_culprit`), when the result's files
    are there: repro.py's header says the phase was lost, not that it is pending."""
    reason = f"lost: {why}"
    versions_state = CulpritState.lost if report.versions_state is CulpritState.running else report.versions_state
    original = ({"original_state": OriginalState.lost, "original_verdict": f"no verdict: {why}"}
                if report.original_state is OriginalState.running else {})
    culprit_fields = ({"culprit_state": CulpritState.lost, "culprit": None, "culprit_reason": reason,
                       "workarounds": [], "workarounds_tried": {}}
                      if report.culprit_state in (None, CulpritState.running) else {})  # a skipped phase stays so
    lost = report.model_copy(update={**culprit_fields, "versions_state": versions_state, **original})
    if (out_dir / "report.json").is_file():
        # torch is behind these two: the worker preloaded it, and the server never calls this
        from minify_worker.engine import artifacts
        from minify_worker.programs import culprit

        try:
            artifacts.rewrite_for_culprit(out_dir, lost, pending_lines=culprit.pending_header_lines(),
                                          final_lines=culprit.stopped_header_lines(reason))
        except (OSError, artifacts.ArtifactWriteError) as error:
            log.warning("could not mark the culprit lost in %s: %s", out_dir, error)
    return lost


def record_worker_lost(redis: Redis, rq_job: Job, why: str) -> None:
    """The process of one attempt of the job (the RQ job's, its ticket's `attempt`) died under it, or
    its worker stopped it: that attempt is re-queued as the next one while the job has retries left,
    else the job failed. A job that died in its culprit phase, or while its original's verdict was
    out, had delivered its result: it stays succeeded, what followed it lost. Every write is fenced
    by the attempt: for one that is no longer the job's current one (re-queued already, another
    attempt runs) nothing is written and nothing queued."""
    ticket = JobTicket.from_wire(rq_job.args[0])
    channel = JobChannel(redis, ticket.keys, ticket.job_id, ticket.attempt)
    raw_status, raw_attempts = patiently(lambda: redis.hmget(ticket.keys.record, ["status", "attempts"]),
                                         channel.patience_s)
    if raw_status is None:
        return
    status, attempts = JobState(raw_status.decode()), int(raw_attempts or 0)
    if ticket.attempt is None:  # a ticket of a server before attempts: the record's current one
        channel.attempt = attempts
    assert channel.attempt is not None
    # A ticket of a server before attempts: RQ counted its retries (and re-queues the same RQ job too;
    # the first of the two entries to start runs the attempt, the other finds it started).
    retries = ticket.retries if ticket.retries is not None else channel.attempt - 1 + (rq_job.retries_left or 0)
    try:
        if status is JobState.succeeded and attempts == channel.attempt:
            # What followed the delivered result (the culprit phase, the original's verdict) is lost.
            raw = redis.hget(ticket.keys.record, "result")
            delivered = Report.model_validate_json(raw) if raw else None
            if delivered is not None and (channel.culprit_running()
                                          or delivered.original_state is OriginalState.running):
                folder = AttemptFolder(ticket.out_dir, channel.attempt).path
                channel.culprit_ended(_culprit_lost(delivered, folder, why))
        elif status is JobState.queued and ticket.attempt is not None and attempts == ticket.attempt - 1:
            channel.enqueue_again(ticket, why, retries)
        elif status is JobState.running and channel.attempt < retries + 1:
            channel.requeue(ticket, why, retries)
        elif status is JobState.running:
            channel.finish(JobState.failed, f"{why}; no retries left", None)
    except AttemptSuperseded:
        log.info("job %s: attempt %s, lost (%s), is no longer the job's current one: nothing to do",
                 ticket.job_id, channel.attempt, why)


def on_rq_failure(rq_job: Job, connection: Redis, exc_type: type, exc_value: BaseException, tb: Any) -> None:
    """RQ failure callback: an abandoned job (its worker died), a stopped or lost attempt, or an
    error that escaped run_job. An attempt that stopped because it was superseded has nothing to say."""
    if issubclass(exc_type, AttemptSuperseded):
        return
    record_worker_lost(connection, rq_job, f"worker lost the job ({exc_type.__name__})")
