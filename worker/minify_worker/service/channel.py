"""A job's Redis channel: one attempt's writes to its record, event stream and counters, fenced by
the attempt, riding out Redis restarts and cut links (docs/service.md, docs/deploy.md).

Every write for a job is fenced by its attempt (ledger.write_for_attempt), so an attempt that was
re-queued, or whose job another attempt now runs, writes nothing more, and its process learns it
and stops; its artifacts go to a folder of its own (`AttemptFolder`), the job's only once it
finished as the current attempt. A Redis restart or a cut link is ridden out for
`redis_patience_s()`: events wait and go in order, final writes are retried, backing off.

Used by the RQ entries: `job.run_job` and the bisection on demand (`versions.bisect.bisect_job`).
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, TypeVar

from redis import ConnectionPool, Redis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from minify_contract import queue
from minify_contract.ledger import (
    AttemptSuperseded,
    JobTicket,
    TicketKeys,
    add_event,
    add_to_bug_index,
    now_iso,
    record_fields,
    write_for_attempt,
)
from minify_contract.models import CulpritState, JobState, Progress, ProgressEvent, Report
from minify_contract.summaries import culprit_summary

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
               folder: AttemptFolder | None = None, *, from_status: JobState = JobState.running,
               filed: Callable[[Any, str], None] | None = None) -> None:
        """The final status, the result and the counters, in one transaction with the last event; a
        succeeded job is filed under its bug in the same transaction (ledger.add_to_bug_index), with
        what `filed(pipe, bug_record)` queues on it. Only from `from_status` (running; queued for a
        job cancelled before it started), as the current attempt: `folder`, the attempt's artifacts,
        becomes the job's just before."""
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
                    bug_id = add_to_bug_index(pipe, self.keys, self.job_id, report, finished_at)
                    if bug_id is not None and filed is not None:
                        filed(pipe, self.keys.bug_record(bug_id))
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
            add_event(pipe, self.keys.events, versions_event(report))

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


def versions_event(report: Report) -> ProgressEvent:
    return ProgressEvent(type="versions", phase="versions",
                         message=report.versions_summary or f"versions: {report.versions_state}")
