"""What the version phase tells a bug: the torch versions its repro fails on, and the one that fixed it.

Every run of a bug's repro on a torch version (a job's version phase, or the service's re-test of an
open bug on a version a worker newly offers) is kept on the bug, the latest per version, in
`minify:bug:<id>:versions` (version -> the run, the job whose repro ran, and how). From all of them
the bug's record gets `status` (`fixed` when a version newer than every failing one passes: that is
`fixed_in`, with the run as evidence), `affected` and `versions_tried`, which the server reads
(minify_server/bugs.py). The server enqueues re-tests (`retest_job`) on the versions' queues and
keeps `minify:bug:<id>:retests` (version -> when) so that each is asked once; a job's version phase
marks there the versions it runs the repro on while it runs (`phase_asks`, `phase_answered`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from redis import Redis

from minify_contract.ledger import bug_retests_key, bug_versions_key
from minify_contract.models import VersionOutcome, VersionRun
from minify_worker.service.versions import ranges


def ran(run: VersionRun) -> bool:
    """Whether `run` is an observation: not a probe no worker answered (or that had no torch to run
    on), which is `cannot_run` without a second spent. The job's own run, answered without a probe,
    fails the same way."""
    return run.seconds > 0 or run.outcome is not VersionOutcome.cannot_run


def record_runs(redis: Redis, bug_record: str, job_id: str, runs: Sequence[VersionRun], how: str) -> str | None:
    """Keep `runs` (of `job_id`'s repro) on the bug whose record is `bug_record` and update its status;
    runs that never ran (`ran`) are left out, so a re-test asks those versions again. Returns the
    status; None (nothing written) when the bug is no longer listed."""
    runs = [run for run in runs if ran(run)]
    if not runs or not redis.exists(bug_record):
        return None
    with redis.pipeline(transaction=True) as pipe:
        for run in runs:
            pipe.hset(bug_versions_key(bug_record), run.torch,
                      json.dumps({"run": run.model_dump(mode="json"), "job": job_id, "how": how}))
        pipe.hdel(bug_retests_key(bug_record), *[run.torch for run in runs])
        pipe.execute()
    stored = {_text(version): json.loads(value)
              for version, value in redis.hgetall(bug_versions_key(bug_record)).items()}
    every = ranges.sort_versions(list(stored))
    known = [VersionRun.model_validate(stored[version]["run"]) for version in every]
    fix = ranges.fixed_in(known)
    evidence = {"job": stored[fix]["job"], "torch": fix, "how": stored[fix]["how"]} if fix else None
    fields = {
        "status": "fixed" if fix else "open",
        "fixed_in": fix or "",
        "fixed_evidence": json.dumps(evidence) if evidence else "",
        "affected": json.dumps([run.torch for run in known if run.outcome is VersionOutcome.same]),
        "versions_tried": json.dumps({run.torch: run.outcome.value for run in known}),
    }
    redis.hset(bug_record, mapping=fields)
    return fields["status"]


def phase_asks(pipe: Any, bug_record: str, versions: Sequence[str]) -> None:
    """Queue on `pipe` the marks of a job's version phase about to run the bug's repro on `versions`
    (its own torch and those its probes go to): asked on the bug (`:retests`, version -> when), as
    the server marks the re-tests it enqueues, so that its sweep of open bugs leaves them to the
    phase. Queued in the transaction that files the job under its bug (`JobChannel.finish`): marked
    after it, a sweep between the two (a second apart at most, on a busy Redis or worker) re-tested
    the new bug on those very versions while the phase, which answers after the culprit phase, had
    not answered yet."""
    if versions:
        pipe.hset(bug_retests_key(bug_record), mapping=dict.fromkeys(versions, str(time.time())))


def phase_answered(redis: Redis, bug_record: str, versions: Sequence[str]) -> None:
    """The version phase is over: what it asked and could not answer (`ran`: `record_runs` kept
    the rest) is the server's to re-test again, at once."""
    if versions:
        redis.hdel(bug_retests_key(bug_record), *versions)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else value


def retest_job(ticket: dict[str, Any]) -> str:
    """The RQ entry of a re-test, on a worker holding the version: the bug's representative repro
    run there, kept on the bug (which may now be fixed)."""
    from rq import get_current_job

    from minify_worker.service.versions.phase import env_for
    from minify_worker.service.versions.probe import run_repro, stop_on_sigterm

    rq_job = get_current_job()
    assert rq_job is not None, "retest_job runs inside an RQ work horse"
    stop_on_sigterm()
    env = env_for(ticket["version"])
    if env is None:
        run = VersionRun(torch=ticket["version"], outcome=VersionOutcome.cannot_run,
                         reason="the worker that took the re-test no longer holds this version")
    else:
        inputs = Path(ticket["inputs"])
        run = run_repro(env, Path(ticket["repro"]), inputs if inputs.is_file() else None, ticket["signature"],
                        timeout_s=ticket.get("timeout_s"))
    return record_runs(rq_job.connection, ticket["bug_record"], ticket["job"], [run], "re-test") or "unlisted"
