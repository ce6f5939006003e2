"""The RQ job entry: run the engine on one attempt of a job and keep its Redis record and event stream current.

The server enqueues `run_job(ticket)`; the ticket (ledger.JobTicket) names the program, the spec,
the result folder, the Redis keys to write and the attempt it runs (the layout, the record's
fields and their encoding are the ledger's, minify_server/ledger.py, which the server reads
through; see docs/service.md). This module imports no torch: the RQ parent imports it for
`on_rq_failure` and `record_worker_lost`; only `run_job`, in the forked work horse, reaches the engine.

Faults between machines (docs/deploy.md): every write for a job is fenced by its attempt
(ledger.write_for_attempt), so an attempt that was re-queued, or whose job another attempt now
runs, writes nothing more, and its process learns it and stops; its artifacts go to a folder of
its own (`AttemptFolder`), the job's only once it finished as the current attempt. A Redis
restart or a cut link is ridden out for `redis_patience_s()`: events wait and go in order, final
writes are retried, backing off.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import signal
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, TypeVar

from redis import ConnectionPool, Redis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry
from rq import get_current_job
from rq.job import Job

from minify_client.models import CulpritState, JobSpec, JobState, OriginalState, Progress, ProgressEvent, Report
from minify_client.progress import culprit_summary
from minify_server import queue
from minify_server.ledger import (
    AttemptSuperseded,
    JobTicket,
    TicketKeys,
    add_event,
    add_to_bug_index,
    now_iso,
    record_fields,
    write_for_attempt,
)
from minify_worker import joblog, programs
from minify_worker.versions import bisect as versions_bisect
from minify_worker.versions import bugs as versions_bugs
from minify_worker.versions import phase as versions_phase
from minify_worker.versions import probe as versions_probe

log = logging.getLogger(__name__)

CANCEL_POLL_S = 0.25
# How long a job rides out Redis being unreachable (restarting, the link to it cut): its events
# wait and its final writes are retried meanwhile; past it the attempt gives up (docs/deploy.md).
REDIS_PATIENCE_S = 120.0
REDIS_PATIENCE_ENV = "MINIFY_REDIS_PATIENCE_S"
BACKOFF_FIRST_S = 0.25
BACKOFF_MAX_S = 4.0
# A call of the job's own client gives up after this long (a cut link drops packets: no refusal comes).
CALL_TIMEOUT_S = 5.0
# Events kept while Redis is unreachable; past it the oldest progress events are dropped.
PENDING_EVENTS_MAX = 1000
UNREACHABLE = (RedisConnectionError, RedisTimeoutError)  # BusyLoadingError (a restart's load) is one too
# An attempt writes while it runs, and after it delivered its result (the culprit and version phases).
_CURRENT = (JobState.running, JobState.succeeded)
_ANY = tuple(JobState)

T = TypeVar("T")


def redis_patience_s() -> float:
    """REDIS_PATIENCE_S, or MINIFY_REDIS_PATIENCE_S (`minify-worker --redis-patience` sets it)."""
    value = os.environ.get(REDIS_PATIENCE_ENV)
    return float(value) if value else REDIS_PATIENCE_S


def patiently(action: Callable[[], T], patience_s: float) -> T:
    """`action()`, again after each connection error (Redis restarting, the link cut), backing off
    from BACKOFF_FIRST_S to BACKOFF_MAX_S, until it answers; past `patience_s` the error is raised."""
    deadline = time.monotonic() + patience_s
    pause = BACKOFF_FIRST_S
    while True:
        try:
            return action()
        except UNREACHABLE:
            if time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, BACKOFF_MAX_S)


def failing_fast(connection: Redis) -> Redis:
    """A client of `connection`'s Redis whose calls fail at once on a connection error (none of
    redis-py's own retries, which take seconds) and give up after CALL_TIMEOUT_S: the job's writes
    are retried by `patiently`, its events wait, and the engine is never held up by a call."""
    pool = connection.connection_pool
    settings = {**pool.connection_kwargs, "retry": Retry(NoBackoff(), 0), "socket_timeout": CALL_TIMEOUT_S,
                "socket_connect_timeout": CALL_TIMEOUT_S}
    return Redis(connection_pool=ConnectionPool(connection_class=pool.connection_class, **settings))


class RedisUnreachable(Exception):
    """Redis did not answer for longer than the patience: the attempt gave up (another worker's
    maintenance re-queues it once its heartbeat expired)."""


class AttemptFolder:
    """Where one attempt of a job writes its artifacts, `<job>/attempts/<n>`, apart from every other
    attempt's. `publish` makes it the job's: `<job>/out` (the ticket's out_dir, what the server
    serves) becomes a link to it, replaced in one rename."""

    def __init__(self, out_dir: Path, attempt: int) -> None:
        self.out_dir = out_dir
        self.path = out_dir.parent / "attempts" / str(attempt)

    def prepare(self) -> Path:
        shutil.rmtree(self.path, ignore_errors=True)
        self.path.mkdir(parents=True)
        return self.path

    def publish(self) -> None:
        link = self.out_dir.parent / f".{self.out_dir.name}-{self.path.name}"
        link.unlink(missing_ok=True)
        link.symlink_to(self.path.relative_to(self.out_dir.parent), target_is_directory=True)
        if self.out_dir.is_dir() and not self.out_dir.is_symlink():  # written in place by an older worker
            shutil.rmtree(self.out_dir)
        os.replace(link, self.out_dir)

    def remove_others(self) -> None:
        """The folders of the job's other attempts: lost ones, never the job's."""
        for other in self.path.parent.iterdir():
            if other != self.path:
                shutil.rmtree(other, ignore_errors=True)


class JobChannel:
    """Writes one attempt of a job: its record, event stream and counters (the keys come from the
    ticket). Every write is fenced by the attempt (`ledger.write_for_attempt`): once the job was
    re-queued or another attempt runs, it is refused (AttemptSuperseded) and `superseded` is set.
    A channel without an attempt (a bisection on demand) writes unfenced.

    While Redis is unreachable, events wait in order and go with the next write that lands; the
    final writes (`finish`, `culprit_ended` ...) retry for `patience_s`."""

    def __init__(self, redis: Redis, keys: TicketKeys, job_id: str = "", attempt: int | None = None,
                 patience_s: float | None = None) -> None:
        self.redis = redis
        self.keys = keys
        self.job_id = job_id
        self.attempt = attempt
        self.patience_s = redis_patience_s() if patience_s is None else patience_s
        self.superseded = threading.Event()
        self.worker: str | None = None  # the worker running the attempt, once this channel started it
        self._writer = uuid.uuid4().hex[:12]
        self._marks = itertools.count(1)
        self._write_lock = threading.Lock()
        self._pending: list[ProgressEvent] = []
        self._pending_lock = threading.Lock()
        self._unreachable_since: float | None = None

    def status(self) -> JobState | None:
        value = self._reach(lambda: self.redis.hget(self.keys.record, "status"))
        return JobState(value.decode() if isinstance(value, bytes) else value) if value else None

    def cancel_requested(self) -> bool:
        return bool(self._reach(lambda: self.redis.exists(self.keys.cancel)))

    def poll(self) -> tuple[bool, bool]:
        """(the cancel flag is set, this attempt is still the job's current one), in one round trip."""
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.exists(self.keys.cancel)
            pipe.hmget(self.keys.record, ["status", "attempts", "worker"])
            cancel, fields = self._reach(pipe.execute)
        status, attempts, running_on = (value.decode() if isinstance(value, bytes) else value for value in fields)
        current = self.attempt is None or (int(attempts or 0) == self.attempt
                                           and status in {state.value for state in _CURRENT}
                                           and (self.worker is None or running_on == self.worker))
        return bool(cancel), current

    def unreachable_for(self) -> float:
        """Seconds since Redis last answered, when its last call failed; else 0."""
        since = self._unreachable_since
        return 0.0 if since is None else time.monotonic() - since

    def _reach(self, call: Callable[[], T]) -> T:
        """`call()`, noting whether Redis answered."""
        try:
            answer = call()
        except UNREACHABLE:
            if self._unreachable_since is None:
                self._unreachable_since = time.monotonic()
            raise
        self._unreachable_since = None
        return answer

    def _write(self, queue_writes: Callable[[Any, int], object], statuses: Collection[JobState] = _CURRENT, *,
               patient: bool = True, mark: str | None = None, before_commit: Callable[[], None] | None = None) -> None:
        """One transaction, fenced by the attempt: the events waiting for Redis, then `queue_writes`.
        Retried on connection errors for `patience_s` when `patient`, under one mark, so that a
        retry of a write that landed applies nothing."""
        mark = mark or f"{self.attempt}:{self._writer}:{next(self._marks)}"
        with self._write_lock:
            if self.superseded.is_set():
                raise AttemptSuperseded(f"attempt {self.attempt} of job {self.job_id} is no longer current")
            with self._pending_lock:
                waiting = list(self._pending)

            def writes(pipe: Any, attempts: int) -> None:
                for event in waiting:
                    self._queue_event(pipe, event)
                queue_writes(pipe, attempts)

            def once() -> None:
                self._reach(lambda: write_for_attempt(self.redis, self.keys.record, self.attempt,
                                                      statuses if self.attempt is not None else _ANY, mark, writes,
                                                      before_commit, self.worker))

            try:
                patiently(once, self.patience_s) if patient else once()
            except AttemptSuperseded:
                self.superseded.set()
                raise
            with self._pending_lock:
                del self._pending[:len(waiting)]

    def _queue_event(self, pipe: Any, event: ProgressEvent) -> None:
        add_event(pipe, self.keys.events, event)
        if event.type == "progress":
            progress = Progress.model_validate(event.model_dump(include=set(Progress.model_fields)))
            pipe.hset(self.keys.record, mapping=record_fields(progress=progress))

    def start(self, worker: str) -> bool:
        """queued → running as the ticket's attempt (`attempt`; None: the next one), unless the job was
        cancelled or ended meanwhile, or this queue entry is stale (its attempt started already, or
        another one runs): then False, and nothing written."""
        wanted = self.attempt
        started: list[int] = []

        def writes(pipe: Any, attempts: int) -> None:
            attempt = attempts + 1
            started.append(attempt)
            pipe.hset(self.keys.record, mapping=record_fields(status=JobState.running, started_at=now_iso(),
                                                              worker=worker, attempts=attempt))
            pipe.hdel(self.keys.record, "reason")
            add_event(pipe, self.keys.events, ProgressEvent(type="status", status=JobState.running,
                                                            message=f"running on {worker} (attempt {attempt})"))

        def once() -> int:
            return self._reach(lambda: write_for_attempt(self.redis, self.keys.record,
                                                         None if wanted is None else wanted - 1, (JobState.queued,),
                                                         f"{wanted}:{self._writer}:start", writes))

        try:
            attempts = patiently(once, self.patience_s)
        except AttemptSuperseded:
            return False
        self.attempt = wanted if wanted is not None else (started[-1] if started else attempts)
        self.worker = worker
        return True

    def publish(self, event: ProgressEvent) -> None:
        """Send `event`; while Redis is unreachable it waits, in order, for the next write that lands
        (the watcher flushes every CANCEL_POLL_S). Raises AttemptSuperseded when refused."""
        with self._pending_lock:
            self._pending.append(event)
            if len(self._pending) > PENDING_EVENTS_MAX:
                oldest = next((index for index, waiting in enumerate(self._pending) if waiting.type == "progress"), 0)
                del self._pending[oldest]
        if self._unreachable_since is None:
            try:
                self.flush()
            except UNREACHABLE as error:
                log.warning("Redis unreachable (%s): the job's events wait for it", error)

    def flush(self) -> None:
        """Send the events waiting for Redis, once."""
        if self._pending:
            self._write(lambda pipe, attempts: None, patient=False)

    def log(self, message: str) -> None:
        self.publish(ProgressEvent(type="log", message=message))

    def finish(self, status: JobState, reason: str | None, report: Report | None,
               folder: AttemptFolder | None = None, *, from_status: JobState = JobState.running) -> None:
        """The final status, the result and the counters, in one transaction with the last event; a
        succeeded job is filed under its bug in the same transaction (ledger.add_to_bug_index).
        Only from `from_status` (running; queued for a job cancelled before it started), as the
        current attempt: `folder`, the attempt's artifacts, becomes the job's just before."""
        finished_at = now_iso()
        culprit_state = report.culprit_state if report is not None else None
        fields = record_fields(status=status, finished_at=finished_at, reason=reason or None, result=report,
                               culprit_state=culprit_state)
        # culprit_state `running`: the stream goes on until the culprit event (minify_server/events.py).
        event = ProgressEvent(type="status", status=status, message=reason or status.value, culprit_state=culprit_state)

        def writes(pipe: Any, attempts: int) -> None:
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

        self._write(writes, (from_status,), before_commit=folder.publish if folder is not None else None)
        if folder is not None:
            folder.remove_others()

    def culprit_ended(self, report: Report) -> None:
        """The culprit phase ended after the result was delivered: the record's result and
        culprit_state, and the `culprit` event that ends the job's stream, in one transaction."""
        state = report.culprit_state or CulpritState.done
        event = ProgressEvent(type="culprit", culprit_state=state, phase="done",
                              message=culprit_summary(report) or report.culprit_reason or state.value)

        def writes(pipe: Any, attempts: int) -> None:
            pipe.hset(self.keys.record, mapping=record_fields(result=report, culprit_state=state))
            add_event(pipe, self.keys.events, event)
            pipe.delete(self.keys.cancel)

        self._write(writes)

    def result_updated(self, report: Report) -> None:
        """The delivered result rewritten by what followed it (the original's verdict, a bisection):
        the record's result."""
        self._write(lambda pipe, attempts: pipe.hset(self.keys.record, mapping=record_fields(result=report)))

    def versions_ended(self, report: Report) -> None:
        """The version phase ended after the final status (no culprit phase followed): the record's
        result and a `versions` event, in one transaction."""

        def writes(pipe: Any, attempts: int) -> None:
            pipe.hset(self.keys.record, mapping=record_fields(result=report))
            add_event(pipe, self.keys.events, _versions_event(report))

        self._write(writes)

    def requeue(self, ticket: JobTicket, why: str, retries: int) -> None:
        """This attempt was lost: the job is queued again as the next attempt (a new RQ job, on the
        queue in the same transaction), the job allowed `retries` re-runs in all."""
        assert self.attempt is not None, "a re-queue names the attempt it replaces"
        following = ticket.model_copy(update={"attempt": self.attempt + 1})
        left = retries - self.attempt

        def writes(pipe: Any, attempts: int) -> None:
            pipe.hset(self.keys.record, mapping=record_fields(status=JobState.queued))
            add_event(pipe, self.keys.events, ProgressEvent(
                type="status", status=JobState.queued,
                message=f"{why}; re-queued as attempt {following.attempt} ({left} retries left)"))
            queue.enqueue(self.redis, following, retries, pipeline=pipe)

        self._write(writes, (JobState.running,), mark=f"{self.attempt}:requeue")

    def enqueue_again(self, ticket: JobTicket, why: str, retries: int) -> None:
        """This attempt's process died before it started the job: its RQ job goes back on the queue."""
        assert self.attempt is not None
        fence = JobChannel(self.redis, self.keys, self.job_id, self.attempt - 1, self.patience_s)

        def writes(pipe: Any, attempts: int) -> None:
            add_event(pipe, self.keys.events,
                      ProgressEvent(type="log", message=f"{why} before it started; queued again"))
            queue.enqueue(self.redis, ticket, retries, pipeline=pipe)

        fence._write(writes, (JobState.queued,), mark=f"{self.attempt}:enqueue-again")

    def culprit_running(self) -> bool:
        value = self._reach(lambda: self.redis.hget(self.keys.record, "culprit_state"))
        return (value.decode() if isinstance(value, bytes) else value) == CulpritState.running.value


def _final_progress(report: Report) -> Progress:
    return Progress(phase="done", nodes_original=report.nodes_original, nodes_current=report.nodes_final,
                    checks_total=report.checks_total, checks_cached=report.checks_cached,
                    outcomes=report.outcomes, elapsed_s=report.elapsed_s, signature=report.signature)


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
        if versions:
            report = report.model_copy(update={"versions_state": CulpritState.running})
        channel.finish(status, reason, report, folder)
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
        from minify_worker import artifacts
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
