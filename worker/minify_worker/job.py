"""The RQ job entry: run the engine on one job and keep its Redis record and event stream current.

The server enqueues `run_job(ticket)`; the ticket (ledger.JobTicket) names the program, the spec,
the result folder and the Redis keys to write (the layout, the record's fields and their encoding
are the ledger's, minify_server/ledger.py, which the server reads through; see docs/service.md).
This module imports no torch: the RQ parent imports it for `on_rq_failure` and
`record_worker_lost`; only `run_job`, in the forked work horse, reaches the engine.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from redis import Redis
from redis.exceptions import RedisError, WatchError
from rq import get_current_job
from rq.job import Job

from minify_client.models import CulpritState, JobSpec, JobState, OriginalState, Progress, ProgressEvent, Report
from minify_client.progress import culprit_summary
from minify_server.ledger import JobTicket, TicketKeys, add_event, add_to_bug_index, now_iso, record_fields
from minify_worker.versions import bisect as versions_bisect
from minify_worker.versions import bugs as versions_bugs
from minify_worker.versions import phase as versions_phase

log = logging.getLogger(__name__)

CANCEL_POLL_S = 0.25
FINAL_WRITE_PATIENCE_S = 120.0


class JobChannel:
    """Writes one job's record, event stream and counters (the keys come from the ticket)."""

    def __init__(self, redis: Redis, keys: TicketKeys, job_id: str = "") -> None:
        self.redis = redis
        self.keys = keys
        self.job_id = job_id

    def status(self) -> JobState | None:
        value = self.redis.hget(self.keys.record, "status")
        return JobState(value.decode() if isinstance(value, bytes) else value) if value else None

    def cancel_requested(self) -> bool:
        return bool(self.redis.exists(self.keys.cancel))

    def start(self, worker: str) -> bool:
        """queued → running, unless the job was cancelled (or already ended) meanwhile."""
        key = self.keys.record
        with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(key)
                    status = pipe.hget(key, "status")
                    status = status.decode() if isinstance(status, bytes) else status
                    if status is None or JobState(status).finished:
                        pipe.unwatch()
                        return False
                    attempt = int(pipe.hget(key, "attempts") or 0) + 1
                    pipe.multi()
                    pipe.hset(key, mapping=record_fields(status=JobState.running, started_at=now_iso(),
                                                         worker=worker, attempts=attempt))
                    pipe.hdel(key, "reason")
                    event = ProgressEvent(type="status", status=JobState.running,
                                          message=f"running on {worker} (attempt {attempt})")
                    add_event(pipe, self.keys.events, event)
                    pipe.execute()
                    return True
                except WatchError:
                    continue

    def publish(self, event: ProgressEvent) -> None:
        with self.redis.pipeline(transaction=True) as pipe:
            add_event(pipe, self.keys.events, event)
            if event.type == "progress":
                progress = Progress.model_validate(event.model_dump(include=set(Progress.model_fields)))
                pipe.hset(self.keys.record, mapping=record_fields(progress=progress))
            pipe.execute()

    def log(self, message: str) -> None:
        self.publish(ProgressEvent(type="log", message=message))

    def finish(self, status: JobState, reason: str | None, report: Report | None) -> None:
        """The final status, the result and the counters, in one transaction with the last event; a
        succeeded job is filed under its bug in the same transaction (ledger.add_to_bug_index)."""
        finished_at = now_iso()
        culprit_state = report.culprit_state if report is not None else None
        fields = record_fields(status=status, finished_at=finished_at, reason=reason or None, result=report,
                               culprit_state=culprit_state)
        # culprit_state `running`: the stream goes on until the culprit event (minify_server/events.py).
        event = ProgressEvent(type="status", status=status, message=reason or status.value, culprit_state=culprit_state)
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.keys.record, mapping=fields)
            if report is not None:
                pipe.hset(self.keys.record, mapping=record_fields(progress=_final_progress(report)))
                counters = self.keys.counters
                pipe.hincrby(counters, "checks_total", report.checks_total)
                pipe.hincrby(counters, "checks_cached", report.checks_cached)
                for kind, count in report.outcomes.items():
                    pipe.hincrby(counters, f"outcome:{kind}", count)
                if status is JobState.succeeded and self.job_id:
                    add_to_bug_index(pipe, self.keys, self.job_id, report, finished_at)
            add_event(pipe, self.keys.events, event)
            pipe.delete(self.keys.cancel)
            pipe.execute()

    def culprit_ended(self, report: Report) -> None:
        """The culprit phase ended after the result was delivered: the record's result and
        culprit_state, and the `culprit` event that ends the job's stream, in one transaction."""
        state = report.culprit_state or CulpritState.done
        event = ProgressEvent(type="culprit", culprit_state=state, phase="done",
                              message=culprit_summary(report) or report.culprit_reason or state.value)
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.keys.record, mapping=record_fields(result=report, culprit_state=state))
            add_event(pipe, self.keys.events, event)
            pipe.delete(self.keys.cancel)
            pipe.execute()

    def result_updated(self, report: Report) -> None:
        """The delivered result rewritten by what followed it (the original's verdict): the record's result."""
        self.redis.hset(self.keys.record, mapping=record_fields(result=report))

    def versions_ended(self, report: Report) -> None:
        """The version phase ended after the final status (no culprit phase followed): the record's
        result and a `versions` event, in one transaction."""
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.keys.record, mapping=record_fields(result=report))
            add_event(pipe, self.keys.events, _versions_event(report))
            pipe.execute()

    def culprit_running(self) -> bool:
        value = self.redis.hget(self.keys.record, "culprit_state")
        return (value.decode() if isinstance(value, bytes) else value) == CulpritState.running.value


def _final_progress(report: Report) -> Progress:
    return Progress(phase="done", nodes_original=report.nodes_original, nodes_current=report.nodes_final,
                    checks_total=report.checks_total, checks_cached=report.checks_cached,
                    outcomes=report.outcomes, elapsed_s=report.elapsed_s, signature=report.signature)


def _retry_redis(action: Callable[[], None], patience_s: float) -> None:
    """Redis may be restarting (embedded mode restarts it); the final write must still land."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            action()
            return
        except RedisError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


class WorkerShutdown(Exception):
    """The worker was stopped mid-job (cold shutdown): RQ re-queues the job while retries are left."""


class _Watcher(threading.Thread):
    """Turns the Redis cancel flag, or the job's deadline, into the engine's cancel Event."""

    def __init__(self, channel: JobChannel, timeout_s: float) -> None:
        super().__init__(name="minify-cancel-watcher", daemon=True)
        self.channel = channel
        self.deadline = time.monotonic() + timeout_s
        self.cancel = threading.Event()
        self.cancelled = False
        self.timed_out = False
        self.interrupted = False
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(CANCEL_POLL_S):
            if time.monotonic() > self.deadline:
                self.timed_out = True
                self.cancel.set()
                return
            try:
                if self.channel.cancel_requested():
                    self.cancelled = True
                    self.cancel.set()
                    return
            except RedisError:
                continue

    def interrupt(self, signum: int, frame: object) -> None:
        """SIGTERM in the work horse (the worker's cold shutdown): stop the engine, then re-queue."""
        self.interrupted = True
        self.cancel.set()

    def stop(self) -> None:
        self._done.set()


def run_job(wire: dict[str, Any]) -> str:
    """Entry point RQ runs in the work horse, given the server's ticket (`JobTicket.to_wire`).
    Returns the final status."""
    rq_job = get_current_job()
    assert rq_job is not None, "run_job runs inside an RQ work horse"
    ticket = JobTicket.from_wire(wire)
    channel = JobChannel(rq_job.connection, ticket.keys, ticket.job_id)
    worker = os.environ.get("RQ_WORKER_ID") or rq_job.worker_name or f"pid {os.getpid()}"
    if channel.cancel_requested():
        if channel.status() is JobState.queued:
            channel.finish(JobState.cancelled, "cancelled before it started", None)
        return JobState.cancelled.value
    if not channel.start(worker):
        return (channel.status() or JobState.cancelled).value
    spec = ticket.spec
    out_dir = ticket.out_dir
    shutil.rmtree(out_dir, ignore_errors=True)  # a retried attempt starts clean
    out_dir.mkdir(parents=True)
    watcher = _Watcher(channel, spec.limits.job_timeout_s)
    watcher.start()
    signal.signal(signal.SIGTERM, watcher.interrupt)
    delivered: list[Report] = []
    probed_versions: list[list[str]] = []

    def finish_and_send_probes(status: JobState, reason: str | None, report: Report | None) -> Report | None:
        """The final status and result; for a succeeded job, then the version phase's probes go out
        to the workers holding other torch versions (`versions_phase.fan_out`)."""
        # Which torch has the bug: a question for torch programs only (a StableHLO job's repro needs jax).
        versions = (spec.versions and spec.program_format == "pt2" and status is JobState.succeeded
                    and report is not None)
        if versions:
            report = report.model_copy(update={"versions_state": CulpritState.running})
        _retry_redis(lambda: channel.finish(status, reason, report), FINAL_WRITE_PATIENCE_S)
        if versions:
            try:
                probed_versions.append(versions_phase.fan_out(channel.redis, ticket.job_id, out_dir, report,
                                                              versions_phase.offered_envs()[0]))
            except RedisError as error:
                log.warning("the version phase could not send its probes: %s", error)
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

    status, reason, report = _minify(channel, ticket, watcher.cancel, deliver, update)
    watcher.stop()
    if delivered:
        # A cancel or the job's timeout stopped the culprit phase only (the engine says so); a
        # shutdown or an error lost it: the job stays succeeded either way and is never re-queued.
        if report is None or status is not JobState.succeeded:
            report = _culprit_lost(delivered[0], out_dir, f"the culprit phase ended in an error: {reason}")
        elif watcher.interrupted:
            report = _culprit_lost(report, out_dir, "the worker shut down during the culprit phase")
        if probed_versions and not watcher.interrupted:
            report = _version_phase(channel, ticket.job_id, out_dir, report, probed_versions[0])
            channel.publish(_versions_event(report))
        if spec.bisect is not None and not watcher.interrupted and report.status is JobState.succeeded:
            report = _bisect(channel, out_dir, report, spec)
        final = report
        _retry_redis(lambda: channel.culprit_ended(final), FINAL_WRITE_PATIENCE_S)
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
        _retry_redis(lambda: channel.versions_ended(found), FINAL_WRITE_PATIENCE_S)
    return status.value


def _minify(channel: JobChannel, ticket: JobTicket, cancel: threading.Event,
            deliver: Callable[[JobState, str | None, Report], None],
            update: Callable[[Report], None]) -> tuple[JobState, str | None, Report | None]:
    from minify_worker import engine  # torch lives behind the engine: import it in the horse only

    def on_event(event: ProgressEvent) -> None:
        if event.type == "culprit" or (event.type == "status" and event.status is not None and event.status.finished):
            return  # published by finish() and culprit_ended(), together with the record
        try:
            channel.publish(event)
        except RedisError as error:
            log.warning("dropped a progress event (Redis unreachable: %s)", error)

    try:
        result = engine.minify(ticket.program, ticket.spec, ticket.out_dir, inputs=ticket.inputs, on_event=on_event,
                               cancel=cancel, on_result=lambda done: deliver(done.status, done.reason, done.report),
                               on_update=lambda updated: update(updated.report))
    except Exception as error:
        log.exception("the engine raised")
        try:
            channel.log("".join(traceback.format_exception(error))[-4000:])
        except RedisError:
            pass
        return JobState.failed, f"internal error: {type(error).__name__}: {error}", None
    return result.status, result.reason, result.report


def _versions_event(report: Report) -> ProgressEvent:
    return ProgressEvent(type="versions", phase="versions",
                         message=report.versions_summary or f"versions: {report.versions_state}")


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
            versions_bugs.record_runs(channel.redis, channel.keys.bug_record(found.bug), job_id, found.versions,
                                      "version phase")
        return found
    except Exception:  # Redis gone, a full disk: the succeeded job stands, the phase is lost
        log.exception("the version phase failed")
        return report.model_copy(update={"versions_state": CulpritState.lost})


def _bisect(channel: JobChannel, out_dir: Path, report: Report, spec: JobSpec) -> Report:
    """The bisection the spec asks for (versions_bisect.for_job), after the version phase."""
    assert spec.bisect is not None

    def save(updated: Report) -> None:
        channel.redis.hset(channel.keys.record, mapping=record_fields(result=updated))

    try:
        return versions_bisect.for_job(out_dir, report, spec.bisect, channel.log, save)
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
        from minify_worker import artifacts, culprit

        try:
            artifacts.rewrite_for_culprit(out_dir, lost, pending_lines=culprit.pending_header_lines(),
                                          final_lines=culprit.stopped_header_lines(reason))
        except (OSError, artifacts.ArtifactWriteError) as error:
            log.warning("could not mark the culprit lost in %s: %s", out_dir, error)
    return lost


def record_worker_lost(redis: Redis, rq_job: Job, why: str) -> None:
    """The job's process died under it: re-queued while RQ has retries left, else failed. A job
    that died in its culprit phase, or while its original's verdict was out, had delivered its
    result: it stays succeeded, what followed it lost."""
    ticket = JobTicket.from_wire(rq_job.args[0])
    channel = JobChannel(redis, ticket.keys)
    status = channel.status()
    if status is JobState.succeeded:
        # What followed the delivered result (the culprit phase, the original's verdict) is lost.
        raw = redis.hget(ticket.keys.record, "result")
        delivered = Report.model_validate_json(raw) if raw else None
        if delivered is not None and (channel.culprit_running()
                                      or delivered.original_state is OriginalState.running):
            channel.culprit_ended(_culprit_lost(delivered, ticket.out_dir, why))
        return
    if status is None or status.finished:
        return
    if rq_job.retries_left:
        redis.hset(ticket.keys.record, mapping=record_fields(status=JobState.queued))
        channel.publish(ProgressEvent(type="status", status=JobState.queued,
                                      message=f"{why}; re-queued ({rq_job.retries_left} retries left)"))
    else:
        channel.finish(JobState.failed, f"{why}; no retries left", None)


def on_rq_failure(rq_job: Job, connection: Redis, exc_type: type, exc_value: BaseException, tb: Any) -> None:
    """RQ failure callback: an abandoned job (its worker died) or an error that escaped run_job."""
    record_worker_lost(connection, rq_job, f"worker lost the job ({exc_type.__name__})")
