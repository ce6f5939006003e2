"""The queue producer: one RQ queue per device class (`cpu`, `cuda`); the worker's job entry runs jobs."""

from __future__ import annotations

import json
from typing import Any

from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.client import Pipeline
from rq import Callback, Queue
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import Job
from rq.worker_registration import REDIS_WORKER_KEYS, WORKERS_BY_QUEUE_KEY

from minify_contract.config_schema import ConfigSchema
from minify_contract.ledger import CONFIG_SCHEMAS_KEY, WORKERS_TORCH_KEY, JobTicket, record_key
from minify_contract.models import TorchInstall, WorkerInfo

QUEUE_NAMES = ("cpu", "cuda")
JOB_ENTRY = "minify_worker.service.job.run_job"
JOB_FAILED = "minify_worker.service.job.on_rq_failure"
# The version phase's queues, one per torch version (minify_worker/service/versions/phase.py), and the re-test's entry.
VERSION_QUEUE_PREFIX = "minify-torch-"
RETEST_ENTRY = "minify_worker.service.versions.bugs.retest_job"
RETEST_TIMEOUT_S = 600
# Bisections on demand (minify_worker/service/versions/bisect.py): served by the workers that have a torch index.
BISECT_QUEUE = "minify-bisect"
BISECT_ENTRY = "minify_worker.service.versions.bisect.bisect_job"
BISECT_TIMEOUT_S = 6 * 3600  # installs of multi-GB releases
# RQ's hard timeout is a backstop: the job entry ends the engine itself at the spec's job_timeout_s.
TIMEOUT_MARGIN_S = 120
RESULT_TTL_S = 7 * 24 * 3600


def rq_job_id(job_id: str, attempt: int | None) -> str:
    """The RQ job that runs attempt `attempt` of the job: one per attempt, so that RQ's record of an
    attempt (started, failed, finished) is that attempt's alone."""
    return job_id if attempt is None or attempt <= 1 else f"{job_id}-attempt-{attempt}"


def enqueue(redis: Redis, ticket: JobTicket, retries: int, pipeline: Pipeline | None = None) -> Job:
    """RQ's job for `ticket` (on the wire as a plain dict, `JobTicket.to_wire`), attempt 1 unless the
    ticket names another, the job allowed `retries` re-runs; with `pipeline` (a transaction the
    caller executes), only queued on it. RQ retries nothing itself: the worker re-queues a lost
    attempt as a new RQ job, fenced by attempt (minify_worker.service.job.record_worker_lost)."""
    spec = ticket.spec
    ticket = ticket.model_copy(update={"attempt": ticket.attempt or 1, "retries": retries})
    queue = Queue(spec.device_class, connection=redis)
    return queue.enqueue(
        JOB_ENTRY,
        ticket.to_wire(),
        job_id=rq_job_id(ticket.job_id, ticket.attempt),
        job_timeout=int(spec.limits.job_timeout_s) + TIMEOUT_MARGIN_S,
        on_failure=Callback(JOB_FAILED),
        result_ttl=RESULT_TTL_S,
        failure_ttl=RESULT_TTL_S,
        description=f"minify {ticket.job_id} attempt {ticket.attempt} on {spec.device}",
        pipeline=pipeline,
    )


def enqueue_retest(redis: Redis, version: str, ticket: dict[str, Any]) -> Job:
    """A re-test of a bug's repro on the queue of torch `version` (any worker holding it answers)."""
    return Queue(VERSION_QUEUE_PREFIX + version, connection=redis).enqueue(
        RETEST_ENTRY, ticket, job_timeout=RETEST_TIMEOUT_S, result_ttl=3600, failure_ttl=RESULT_TTL_S,
        description=f"re-test of bug {ticket['bug_record']} on torch {version}")


def enqueue_bisect(redis: Redis, ticket: dict[str, Any]) -> Job:
    """A bisection of a job's repro on the queue of the workers that can install torch releases."""
    return Queue(BISECT_QUEUE, connection=redis).enqueue(
        BISECT_ENTRY, ticket, job_timeout=BISECT_TIMEOUT_S, result_ttl=3600, failure_ttl=RESULT_TTL_S,
        description=f"bisect {ticket['job_id']} {ticket['request']['good']}..{ticket['request']['bad']}")


def dequeue(redis: Redis, job_id: str) -> None:
    """Take a queued job off its queue (it was cancelled before a worker took it): the RQ job of
    its next attempt."""
    attempts = redis.hget(record_key(job_id), "attempts")
    try:
        Job.fetch(rq_job_id(job_id, int(attempts or 0) + 1), connection=redis).cancel()
    except (NoSuchJobError, InvalidJobOperation):
        pass
    except ValueError as error:
        # A worker took the RQ job as its record turned cancelled, and its run (which starts
        # nothing of a cancelled record) ended meanwhile: the job is off the queue, the worker ends it.
        if not raced_a_worker(error):
            raise


def raced_a_worker(error: ValueError) -> bool:
    """Whether RQ's removal of a started job (`Job.cancel`, `Job.delete`) met its worker ending
    the job's execution between RQ's two reads of it (the execution's id, then its hash):
    `ValueError: Execution ... not found in Redis`. The worker ends what it started either way."""
    return str(error).startswith("Execution ") and str(error).endswith(" not found in Redis")


async def queue_depths(redis: AsyncRedis) -> dict[str, int]:
    """Jobs waiting per queue (the length of RQ's list for it)."""
    async with redis.pipeline(transaction=False) as pipe:
        for name in QUEUE_NAMES:
            pipe.llen(Queue.redis_queue_namespace_prefix + name)
        return dict(zip(QUEUE_NAMES, await pipe.execute(), strict=True))


async def live_workers(redis: AsyncRedis, queue_name: str | None = None) -> int:
    """Workers (of one queue, or all) whose heartbeat has not expired.

    RQ's worker sets keep a dead worker's name until a maintenance pass; its record (a key with the
    heartbeat's expiry) is what says it is alive.
    """
    names = await redis.smembers(WORKERS_BY_QUEUE_KEY % queue_name if queue_name else REDIS_WORKER_KEYS)
    return await redis.exists(*names) if names else 0


async def worker_infos(redis: AsyncRedis) -> list[WorkerInfo]:
    """Live workers (their record not expired), by name: RQ's record and the torch versions each
    announced for the version phase."""
    names = sorted(await redis.smembers(REDIS_WORKER_KEYS))
    async with redis.pipeline(transaction=False) as pipe:
        for key in names:
            pipe.hgetall(key)
        records = await pipe.execute()
    announced = await redis.hgetall(WORKERS_TORCH_KEY)
    workers = []
    for key, record in zip(names, records, strict=True):
        if not record:
            continue  # expired: RQ's set keeps the name until a maintenance pass
        name = key.removeprefix("rq:worker:")
        torch = json.loads(announced[name])["torch"] if name in announced else []
        workers.append(WorkerInfo(
            name=name, state=record.get("state"), current_job=record.get("current_job") or None,
            queues=[queue for queue in record.get("queues", "").split(",") if queue],
            last_heartbeat=record.get("last_heartbeat") or None,
            torch=[TorchInstall.model_validate(install) for install in torch]))
    return workers


async def config_schemas(redis: AsyncRedis) -> list[ConfigSchema]:
    """What the torch of each live worker accepts in JobSpec.config, as the workers published it
    (minify_contract.config_schema); none where no live worker published one."""
    published = await redis.hgetall(CONFIG_SCHEMAS_KEY)
    held = torch_versions_held(await worker_infos(redis))
    return [ConfigSchema.model_validate_json(text) for version, text in sorted(published.items()) if version in held]


def torch_versions_held(workers: list[WorkerInfo]) -> dict[str, int]:
    """torch version -> how many of `workers` hold it, sorted by version text."""
    counts: dict[str, int] = {}
    for worker in workers:
        for version in {install.torch for install in worker.torch}:
            counts[version] = counts.get(version, 0) + 1
    return dict(sorted(counts.items()))
