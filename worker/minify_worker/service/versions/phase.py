"""The version phase: after a job's result is delivered, its repro.py under every other torch the
fleet offers, then report.json, repro.py's header and the job record say which versions have the bug.

Fleet side. Each worker announces the torch installations it holds (`announce`, on every
heartbeat: `minify:workers:torch`, worker name -> its versions) and listens on one queue per
version, `minify-torch-<version>`. A worker whose record has expired no longer counts.

Job side (minify_worker/service/job.py, in the work horse). At delivery, `fan_out` enqueues one probe
job (`probe_job`) per version the live fleet offers besides the job's own, each on its version's
queue: any idle worker that holds it answers, several at once, while this horse runs the culprit
phase. After it, `collect` waits for the answers (each probe writes its `VersionRun` to the
job's `minify:job:<id>:versions` hash). A probe still queued for a version this worker holds is
taken off its queue and run here: a fleet of one worker, busy with this very job, answers too.
What no worker answered by the deadline is said so. The job's own version needs no probe: the
job ran the minimal program there and it failed with the signature.

Offline (`minify-worker minify`): `run_locally` runs the probes against the envs the command has.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from redis import Redis
from rq import Queue, Worker
from rq.exceptions import NoSuchJobError
from rq.job import Job

from minify_contract.ledger import WORKERS_TORCH_KEY, job_versions_key
from minify_contract.models import CulpritState, Report, VersionOutcome, VersionRun
from minify_contract.queue import raced_a_worker
from minify_worker.service.versions import ranges
from minify_worker.service.versions.envs import TorchEnv, configured_envs
from minify_worker.service.versions.probe import probe_timeout_s, run_repro, stop_all, stop_on_sigterm

log = logging.getLogger(__name__)

QUEUE_PREFIX = "minify-torch-"
PROBE_ENTRY = "minify_worker.service.versions.phase.probe_job"
RESULTS_TTL_S = 7 * 24 * 3600
# How long a probe may wait for a worker on top of its own timeout before the phase gives up on it.
QUEUE_WAIT_S = 60.0
LOCAL_PARALLELISM = 2  # probes this process runs at once: each is a torch import and a compile
POLL_S = 0.2
REPRO = "repro.py"
INPUTS = "inputs.pt"

_offered: list[TorchEnv] | None = None


def offered_envs() -> list[TorchEnv]:
    """This process's torch installations (`envs.configured_envs`), read once: the RQ worker reads
    them at start, and its work horses inherit them."""
    global _offered
    if _offered is None:
        _offered = configured_envs()
    return _offered


def queue_name(version: str) -> str:
    return QUEUE_PREFIX + version


def probe_job_id(job_id: str, version: str) -> str:
    return f"{job_id}-torch-{re.sub(r'[^A-Za-z0-9_-]', '_', version)}"


# -- the fleet ------------------------------------------------------------------------------------


def announce(redis: Any, worker_name: str, envs: Sequence[TorchEnv]) -> None:
    """Say which torch versions `worker_name` holds (`redis` may be a pipeline)."""
    redis.hset(WORKERS_TORCH_KEY, worker_name,
               json.dumps({"torch": [env.describe() for env in envs], "at": int(time.time())}))


def fleet(redis: Redis) -> dict[str, list[dict[str, Any]]]:
    """Live workers (their RQ record not expired) -> the torch installations each announced."""
    announced = redis.hgetall(WORKERS_TORCH_KEY)
    names = [name.decode() if isinstance(name, bytes) else name for name in announced]
    if not names:
        return {}
    with redis.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.exists(Worker.redis_worker_namespace_prefix + name)
        alive = pipe.execute()
    return {name: json.loads(value)["torch"] for name, value, live in zip(names, announced.values(), alive, strict=True)
            if live}


def fleet_versions(redis: Redis) -> dict[str, str | None]:
    """Every torch version a live worker holds -> its git version."""
    versions: dict[str, str | None] = {}
    for envs in fleet(redis).values():
        for env in envs:
            versions.setdefault(env["torch"], env.get("git_version"))
    return versions


# -- the job's side -------------------------------------------------------------------------------


def own_run(report: Report, own: TorchEnv) -> VersionRun:
    """The job's own torch: the job ran the minimal program there and it failed with the signature."""
    return VersionRun(torch=own.torch, git_version=own.git_version, outcome=VersionOutcome.same,
                      signature=report.signature, reason="the job's own run of the minimal program", seconds=0.0)


def _ticket(job_id: str, version: str, out_dir: Path, signature: str | None) -> dict[str, Any]:
    return {"job_id": job_id, "version": version, "repro": str(out_dir / REPRO), "inputs": str(out_dir / INPUTS),
            "signature": signature, "results": job_versions_key(job_id), "timeout_s": probe_timeout_s()}


def versions_to_probe(redis: Redis, own: TorchEnv) -> list[str]:
    """The versions the live fleet offers besides `own`, oldest first: where `fan_out` sends probes."""
    return [version for version in ranges.sort_versions(list(fleet_versions(redis))) if version != own.torch]


def fan_out(redis: Redis, job_id: str, out_dir: Path, report: Report, versions: list[str]) -> None:
    """Enqueue a probe of the job's repro per version of `versions` (`versions_to_probe`)."""
    redis.delete(job_versions_key(job_id))  # a retried attempt starts clean
    for version in versions:
        ticket = _ticket(job_id, version, out_dir, report.signature)
        Queue(queue_name(version), connection=redis).enqueue(
            PROBE_ENTRY, ticket, job_id=probe_job_id(job_id, version),
            job_timeout=int(ticket["timeout_s"] + QUEUE_WAIT_S), result_ttl=3600, failure_ttl=3600,
            description=f"repro of {job_id} on torch {version}")


def env_for(version: str) -> TorchEnv | None:
    return next((env for env in offered_envs() if env.torch == version), None)


def _probe(ticket: dict[str, Any]) -> VersionRun:
    env = env_for(ticket["version"])
    if env is None:
        return VersionRun(torch=ticket["version"], outcome=VersionOutcome.cannot_run,
                          reason="the worker that took the probe no longer holds this version")
    inputs = Path(ticket["inputs"])
    return _run_or_say_why(env, Path(ticket["repro"]), inputs if inputs.is_file() else None, ticket["signature"],
                           ticket["timeout_s"])


def _run_or_say_why(env: TorchEnv, repro: Path, inputs: Path | None, signature: str | None,
                    timeout_s: float | None = None) -> VersionRun:
    """One probe; whatever goes wrong is its answer (a question left unanswered would hold the
    job's phase until its deadline)."""
    try:
        return run_repro(env, repro, inputs, signature, timeout_s=timeout_s)
    except OSError as error:  # the interpreter or the repro went away
        return VersionRun(torch=env.torch, git_version=env.git_version, outcome=VersionOutcome.cannot_run,
                          reason=f"could not run the repro: {error}")


def _record(redis: Redis, ticket: dict[str, Any], run: VersionRun) -> None:
    with redis.pipeline(transaction=True) as pipe:
        pipe.hset(ticket["results"], ticket["version"], run.model_dump_json())
        pipe.expire(ticket["results"], RESULTS_TTL_S)
        pipe.execute()


def probe_job(ticket: dict[str, Any]) -> str:
    """The RQ entry a worker holding the version runs: one probe, its answer in the job's results."""
    from rq import get_current_job

    rq_job = get_current_job()
    assert rq_job is not None, "probe_job runs inside an RQ work horse"
    stop_on_sigterm()
    run = _probe(ticket)
    _record(rq_job.connection, ticket, run)
    return run.outcome.value


def collect(redis: Redis, job_id: str, out_dir: Path, report: Report, versions: Sequence[str],
            deadline: float, cancelled: Callable[[], bool]) -> tuple[list[VersionRun], str | None]:
    """The answers to `fan_out`'s probes, oldest version first, by `deadline` (time.monotonic()).
    Probes still queued for a version this process holds are taken off their queue and run here.
    Returns the runs and, when the phase stopped early, why ("cancelled")."""
    pending = set(versions)
    claimed: set[str] = set()
    stopped = None
    with ThreadPoolExecutor(max_workers=LOCAL_PARALLELISM, thread_name_prefix="minify-version-probe") as pool:
        while True:
            answered = {key.decode() if isinstance(key, bytes) else key
                        for key in redis.hkeys(job_versions_key(job_id))}
            if pending <= answered:
                break
            if cancelled():
                stopped = "cancelled"
                break
            if time.monotonic() > deadline:
                break
            for version in sorted(pending - answered - claimed):
                if env_for(version) is None:
                    continue
                rq_id = probe_job_id(job_id, version)
                if Queue(queue_name(version), connection=redis).remove(rq_id):
                    claimed.add(version)
                    _forget_rq_job(redis, rq_id)
                    ticket = _ticket(job_id, version, out_dir, report.signature)
                    pool.submit(lambda ticket=ticket: _record(redis, ticket, _probe(ticket)))
            time.sleep(POLL_S)
        if stopped is not None:
            pool.shutdown(wait=False, cancel_futures=True)
            stop_all()  # the probes running here end now, not at their timeout
    raw = redis.hgetall(job_versions_key(job_id))
    runs = {}
    for value in raw.values():
        run = VersionRun.model_validate_json(value)
        runs[run.torch] = run
    for version in pending - set(runs):
        _forget_rq_job(redis, probe_job_id(job_id, version))
        why = "cancelled before it ran" if stopped else "no worker holding it answered in time"
        runs[version] = VersionRun(torch=version, outcome=VersionOutcome.cannot_run, reason=why)
    return [runs[version] for version in ranges.sort_versions(list(runs))], stopped


def _forget_rq_job(redis: Redis, rq_id: str) -> None:
    try:
        Job.fetch(rq_id, connection=redis).delete()
    except NoSuchJobError:
        pass
    except ValueError as error:  # a probe ending on its worker right now: the worker removes it
        if not raced_a_worker(error):
            raise


def with_versions(report: Report, runs: Sequence[VersionRun], state: CulpritState = CulpritState.done) -> Report:
    """`report` with the phase's findings: the runs (oldest version first), the range, the fix and the
    summary line."""
    runs = sorted(runs, key=lambda run: ranges.parse_version(run.torch))
    found = ranges.regression_range(runs)
    return report.model_copy(update={
        "versions_state": state, "versions": runs, "regression_range": found.range,
        "regression_reason": found.reason, "fixed_in": ranges.fixed_in(runs), "versions_summary": ranges.summary(runs)})


def header_lines(report: Report) -> list[str]:
    """repro.py's header paragraph for the phase's findings; none where one torch version was tried
    (the job's own: there is no range to tell)."""
    if not report.versions_compared:
        return []
    lines = [f"Torch versions:   {report.versions_summary}"]
    for run in report.versions:
        built = f" (git {run.git_version[:12]})" if run.git_version else ""
        detail = {VersionOutcome.different: run.signature, VersionOutcome.cannot_run: run.reason}.get(run.outcome)
        took = f" ({run.seconds:.1f} s)" if run.seconds else ""
        lines.append(f"  {run.torch}{built}: {run.outcome.value}{took}" + (f": {detail}" if detail else ""))
    return lines


def write_findings(out_dir: Path, report: Report) -> None:
    """report.json, repro.py's header and the bundle, each replaced whole."""
    from minify_worker.engine import artifacts  # torch: the horse and the offline command have it already

    artifacts.rewrite_with_header_lines(out_dir, report, header_lines(report))


def run_locally(out_dir: Path, report: Report, envs: Sequence[TorchEnv],
                on_run: Callable[[VersionRun], None] | None = None) -> Report:
    """The offline phase: repro.py under each of `envs` (the first is the job's own), several at once."""
    own, others = envs[0], list(envs[1:])
    inputs = out_dir / INPUTS

    def probe(env: TorchEnv) -> VersionRun:
        run = _run_or_say_why(env, out_dir / REPRO, inputs if inputs.is_file() else None, report.signature)
        if on_run is not None:
            on_run(run)
        return run

    with ThreadPoolExecutor(max_workers=LOCAL_PARALLELISM, thread_name_prefix="minify-version-probe") as pool:
        runs = [own_run(report, own), *pool.map(probe, others)]
    return with_versions(report, runs)
