"""The bug index: succeeded jobs grouped by what they found (minify_contract.bugs.bug_key).

The worker files a succeeded job under its bug in the transaction that ends the job
(minify_worker/service/job.py, with the key names of the ticket; ledger.add_to_bug_index): `minify:bug:<id>`
(a hash: signature, graph shape hash, failure kind, backend, device, first and last seen, the
representative job, the first one filed), `minify:bug:<id>:jobs` (its job ids by finish time) and
`minify:bugs` (bug ids by last seen). This module reads it, and forgets bugs for retention.

Bugs know their torch versions (minify_worker/service/versions/bugs.py writes `status`, `affected`,
`fixed_in`, `fixed_evidence` and `versions_tried` on the record, from `minify:bug:<id>:versions`).
When a worker offers a torch version an open bug has not been tried on, `retest_periodically`
enqueues a re-test of its representative repro there, a few per sweep
(`Settings.retest_per_sweep` every `retest_interval_s`): ClusterFuzz's re-test of open bugs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from datetime import datetime, timezone
from typing import Any

from redis import Redis as SyncRedis
from redis.asyncio import Redis
from redis.exceptions import WatchError

from minify_contract import queue
from minify_contract.ledger import (
    BUGS_KEY,
    TicketKeys,
    add_to_bug_index,
    bug_jobs_key,
    bug_record_key,
    bug_retests_key,
    bug_versions_key,
    record_key,
)
from minify_contract.models import Bug, BugChange, BugFix, BugResolution, Report
from minify_server.connections import UNAVAILABLE
from minify_server.store import ArtifactStore

log = logging.getLogger(__name__)

# A bug lists its most recent jobs; `count` counts them all.
JOB_IDS_SHOWN = 100
# A bug keeps this many closes and reopens, the latest.
HISTORY_KEPT = 200
# The record's fields of the closing in force (a bug closed by hand).
CLOSURE_FIELDS = ("closed_at", "closed_by", "close_reason", "resolution")
# A re-test no worker answered in this long is asked again (its worker went away).
RETEST_PATIENCE_S = 3600.0


def bug_history_key(bug_record: str) -> str:
    """A bug's closes and reopens, oldest first (JSON `BugChange`s); `bug_record` is its record's key."""
    return f"{bug_record}:history"


class BugStateError(Exception):
    """A close of a closed bug, or a reopen of one that is not closed (409)."""


def _closure(fields: dict[str, str]) -> BugChange | None:
    """The closing in force, from the bug's record."""
    if not fields.get("closed_at"):
        return None
    return BugChange(action="closed", at=fields["closed_at"], by=fields.get("closed_by") or None,
                     reason=fields.get("close_reason", ""), resolution=fields.get("resolution") or "fixed")  # type: ignore[arg-type]


def _regression(closure: BugChange | None, first_since: list[tuple[str, float]]) -> BugChange | None:
    """The rule: a bug closed as fixed is open again from the first job filed under it after the
    close (regressed); one closed as wont_fix or not_a_bug stays closed."""
    if closure is None or closure.resolution != "fixed" or not first_since:
        return None
    job_id, seen = first_since[0]
    return BugChange(action="regressed", at=datetime.fromtimestamp(seen, timezone.utc), job=job_id,
                     reason=f"job {job_id} found it again after it was closed as fixed")


def _bug(fields: dict[str, str], job_ids: list[str], count: int, history: list[str] | None = None,
         first_since: list[tuple[str, float]] | None = None, since: int = 0) -> Bug:
    representative = fields["representative"]
    closure = _closure(fields)
    regression = _regression(closure, first_since or [])
    changes = [BugChange.model_validate_json(entry) for entry in history or []]
    if regression is not None:
        changes.append(regression)
    closed = closure is not None and regression is None
    status = "closed" if closed else (fields.get("status") or "open")
    return Bug(
        id=fields["id"], signature=fields.get("signature", ""), graph_shape_hash=fields.get("graph_shape_hash", ""),
        failure_kind=fields.get("failure_kind") or None, backend=fields.get("backend", ""),
        device=fields.get("device", ""), count=count, job_ids=job_ids, first_seen=fields["first_seen"],
        last_seen=fields["last_seen"], representative=representative,
        repro=f"/v1/jobs/{representative}/artifacts/repro.py", dashboard=f"/#/bugs/{fields['id']}",
        status=status, closure=closure if closed else None, jobs_since_closed=since if closed else 0, history=changes,
        fixed_in=fields.get("fixed_in") or None,
        fixed_evidence=BugFix.model_validate_json(fields["fixed_evidence"]) if fields.get("fixed_evidence") else None,
        affected=json.loads(fields.get("affected") or "[]"),
        versions_tried=json.loads(fields.get("versions_tried") or "{}"),
    )


class BugIndex:
    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    async def _read(self, bug_ids: list[str]) -> list[Bug]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for bug_id in bug_ids:
                pipe.hgetall(bug_record_key(bug_id))
                pipe.zrevrange(bug_jobs_key(bug_id), 0, JOB_IDS_SHOWN - 1)
                pipe.zcard(bug_jobs_key(bug_id))
            replies = await pipe.execute()
        found = [(bug_id, *replies[index:index + 3]) for bug_id, index in zip(bug_ids, range(0, len(replies), 3),
                                                                                 strict=True)]
        found = [entry for entry in found if entry[1].get("representative")]
        # The closed ones: their history, and the jobs filed since the close (a regression, if fixed).
        closed = [(bug_id, fields) for bug_id, fields, _, _ in found if fields.get("closed_at")]
        async with self.redis.pipeline(transaction=False) as pipe:
            for bug_id, *_ in found:
                pipe.lrange(bug_history_key(bug_record_key(bug_id)), 0, -1)
            for bug_id, fields in closed:
                after = f"({datetime.fromisoformat(fields['closed_at']).timestamp()}"
                pipe.zrangebyscore(bug_jobs_key(bug_id), after, "+inf", start=0, num=1, withscores=True)
                pipe.zcount(bug_jobs_key(bug_id), after, "+inf")
            extra = await pipe.execute()
        histories = dict(zip([bug_id for bug_id, *_ in found], extra[:len(found)], strict=True))
        since = {bug_id: (extra[len(found) + 2 * index], extra[len(found) + 2 * index + 1])
                 for index, (bug_id, _) in enumerate(closed)}
        return [_bug(fields, job_ids, count, histories[bug_id], *since.get(bug_id, ([], 0)))
                for bug_id, fields, job_ids, count in found]

    async def get(self, bug_id: str) -> Bug | None:
        found = await self._read([bug_id])
        return found[0] if found else None

    async def page(self, offset: int, limit: int, status: str | None = None,
                   search: str | None = None) -> tuple[list[Bug], int]:
        """Bugs, most recently seen first; only those `status` (open, fixed, closed) says, and those whose id,
        signature, failure kind, backend or device hold `search` (any case), when given."""
        if status is None and not search:
            total = await self.redis.zcard(BUGS_KEY)
            bug_ids = await self.redis.zrevrange(BUGS_KEY, offset, offset + limit - 1)
            return await self._read(bug_ids), total
        needle = (search or "").lower()
        chosen = [bug for bug in await self._read(await self.redis.zrevrange(BUGS_KEY, 0, -1))
                  if (status is None or bug.status == status)
                  and needle in " ".join([bug.id, bug.signature, bug.failure_kind or "", bug.backend,
                                          bug.device]).lower()]
        return chosen[offset:offset + limit], len(chosen)

    async def close(self, bug_id: str, reason: str, resolution: BugResolution, by: str) -> Bug | None:
        """Close the bug by hand, `by` whom and why; None when there is no such bug. Raises
        BugStateError when it is closed already. A regression not yet in its history (a job found
        it again since it was last closed as fixed) goes there first."""
        return await self._change(bug_id, BugChange(action="closed", at=datetime.now(timezone.utc), by=by,
                                                    reason=reason, resolution=resolution))

    async def reopen(self, bug_id: str, reason: str, by: str) -> Bug | None:
        """Reopen a bug closed by hand; None when there is no such bug. Raises BugStateError when it
        is not closed (open, regressed, or fixed by a newer torch: a state no hand set)."""
        return await self._change(bug_id, BugChange(action="reopened", at=datetime.now(timezone.utc), by=by,
                                                    reason=reason))

    async def _change(self, bug_id: str, change: BugChange) -> Bug | None:
        record = bug_record_key(bug_id)
        history = bug_history_key(record)
        async with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(record, bug_jobs_key(bug_id))
                    bug = await self.get(bug_id)
                    if bug is None:
                        return None
                    if change.action == "closed" and bug.status == "closed":
                        assert bug.closure is not None
                        raise BugStateError(f"bug {bug_id} is closed already ({_closure_words(bug.closure)})")
                    if change.action == "reopened" and bug.status != "closed":
                        raise BugStateError(f"bug {bug_id} is not closed: it is {_status_words(bug)}")
                    pipe.multi()
                    if bug.history and bug.history[-1].action == "regressed" and change.action == "closed":
                        pipe.rpush(history, bug.history[-1].model_dump_json())  # derived until now: kept
                    if change.action == "closed":
                        pipe.hset(record, mapping={"closed_at": change.at.isoformat(), "closed_by": change.by or "",
                                                   "close_reason": change.reason,
                                                   "resolution": change.resolution or "fixed"})
                    else:
                        pipe.hdel(record, *CLOSURE_FIELDS)
                    pipe.rpush(history, change.model_dump_json())
                    pipe.ltrim(history, -HISTORY_KEPT, -1)
                    await pipe.execute()
                    return await self.get(bug_id)
                except WatchError:
                    continue

    async def count(self) -> int:
        return await self.redis.zcard(BUGS_KEY)

    async def representatives(self) -> set[str]:
        """The job of every listed bug that stands for it: retention keeps these."""
        bug_ids = await self.redis.zrange(BUGS_KEY, 0, -1)
        async with self.redis.pipeline(transaction=False) as pipe:
            for bug_id in bug_ids:
                pipe.hget(bug_record_key(bug_id), "representative")
            return {job_id for job_id in await pipe.execute() if job_id}

    async def file_unfiled(self, jobs: list[tuple[str, datetime]]) -> int:
        """File succeeded jobs that no worker filed, `(job id, finished_at)`: a job queued before the
        server knew of bugs (its ticket names no bug keys) and run by a worker that does. The key is
        computed from its report (minify_contract.bugs.bug_key), as the worker computes it. Returns the
        jobs filed."""
        filed = 0
        for job_id, finished_at in jobs:
            result = await self.redis.hget(record_key(job_id), "result")
            report = Report.model_validate_json(result) if result else None
            if report is None:
                continue
            async with self.redis.pipeline(transaction=True) as pipe:
                if add_to_bug_index(pipe, TicketKeys.for_job(job_id), job_id, report, finished_at.isoformat()):
                    await pipe.execute()
                    filed += 1
        return filed

    async def forget_seen_before(self, cutoff: float) -> list[str]:
        """Unlist the bugs last seen before `cutoff` (epoch seconds); their jobs become ordinary ones."""
        bug_ids = await self.redis.zrangebyscore(BUGS_KEY, "-inf", f"({cutoff}")
        if bug_ids:
            async with self.redis.pipeline(transaction=True) as pipe:
                for bug_id in bug_ids:
                    pipe.zrem(BUGS_KEY, bug_id)
                    record = bug_record_key(bug_id)
                    pipe.delete(record, bug_jobs_key(bug_id), bug_versions_key(record), bug_retests_key(record),
                                bug_history_key(record))
                await pipe.execute()
        return bug_ids

    async def retests_due(self, versions: list[str], limit: int) -> list[tuple[str, dict[str, str], str]]:
        """Up to `limit` (bug id, its record, torch version): open bugs and the versions among
        `versions` their repro has not run on, nor been asked to lately."""
        due: list[tuple[str, dict[str, str], str]] = []
        now = time.time()
        for bug_id in await self.redis.zrevrange(BUGS_KEY, 0, -1):
            record = bug_record_key(bug_id)
            fields = await self.redis.hgetall(record)
            if not fields.get("representative") or fields.get("status") == "fixed":
                continue
            tried = set(await self.redis.hkeys(bug_versions_key(record)))
            asked = {version for version, at in (await self.redis.hgetall(bug_retests_key(record))).items()
                     if now - float(at) < RETEST_PATIENCE_S}
            for version in versions:
                if version not in tried | asked:
                    due.append((bug_id, fields, version))
                    if len(due) >= limit:
                        return due
        return due


RESOLUTION_WORDS = {"fixed": "fixed", "wont_fix": "won't fix", "not_a_bug": "not a bug"}


def _closure_words(closure: BugChange) -> str:
    """`won't fix, by alice: flaky hardware`."""
    return f"{RESOLUTION_WORDS.get(closure.resolution or 'fixed')}, by {closure.by or 'someone'}: {closure.reason}"


def _status_words(bug: Bug) -> str:
    if bug.status == "fixed":
        return f"fixed in torch {bug.fixed_in} (its repro passes there)"
    if bug.history and bug.history[-1].action == "regressed":
        return f"open (regressed: {bug.history[-1].reason})"
    return "open"


def _retest_ticket(bug_id: str, fields: dict[str, str], version: str, store: ArtifactStore) -> dict[str, Any]:
    out_dir = store.out_dir(fields["representative"])
    return {"bug_record": bug_record_key(bug_id), "job": fields["representative"], "version": version,
            "repro": str(out_dir / "repro.py"), "inputs": str(out_dir / "inputs.pt"),
            "signature": fields.get("signature") or None}


async def retest(bugs: BugIndex, sync_redis: SyncRedis, store: ArtifactStore, limit: int) -> int:
    """Enqueue up to `limit` re-tests of open bugs on the torch versions live workers offer that
    their repro has not run on. Returns how many."""
    versions = list(queue.torch_versions_held(await queue.worker_infos(bugs.redis)))
    due = await bugs.retests_due(versions, limit)
    for bug_id, fields, version in due:
        ticket = _retest_ticket(bug_id, fields, version, store)
        await asyncio.to_thread(queue.enqueue_retest, sync_redis, version, ticket)  # cancellable, unlike anyio's
        await bugs.redis.hset(bug_retests_key(bug_record_key(bug_id)), version, str(time.time()))
    return len(due)


async def retest_periodically(bugs: BugIndex, sync_redis: SyncRedis, store: ArtifactStore, limit: int,
                              interval_s: float) -> None:
    """The server's background task: re-tests of open bugs on newly offered torch versions, a
    bounded number every `interval_s`, until cancelled."""
    while True:
        try:
            enqueued = await retest(bugs, sync_redis, store, limit)
            if enqueued:
                log.info("re-testing %d open bug(s) on newly offered torch versions", enqueued)
        except UNAVAILABLE as error:
            log.warning("bug re-tests skipped: Redis unavailable (%s)", error)
        except Exception:
            log.exception("bug re-tests failed")
        await asyncio.sleep(interval_s)
