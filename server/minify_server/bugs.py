"""The bug index: succeeded jobs grouped by what they found (minify_client.bugs.bug_key).

The worker files a succeeded job under its bug in the transaction that ends the job
(minify_worker/job.py, with the key names of the ticket): `minify:bug:<id>` (a hash: signature,
graph shape hash, failure kind, backend, device, first and last seen, the representative job, the
first one filed), `minify:bug:<id>:jobs` (its job ids by finish time) and `minify:bugs` (bug ids by
last seen). This module reads it, and forgets bugs for retention.
"""

from __future__ import annotations

from redis.asyncio import Redis

from minify_client.bugs import add_to_bug_index
from minify_client.models import Bug, Report
from minify_server.records import BUGS_KEY, bug_jobs_key, bug_record_key, record_key, ticket_keys

# A bug lists its most recent jobs; `count` counts them all.
JOB_IDS_SHOWN = 100


def _bug(fields: dict[str, str], job_ids: list[str], count: int) -> Bug:
    representative = fields["representative"]
    return Bug(
        id=fields["id"], signature=fields.get("signature", ""), graph_shape_hash=fields.get("graph_shape_hash", ""),
        failure_kind=fields.get("failure_kind") or None, backend=fields.get("backend", ""),
        device=fields.get("device", ""), count=count, job_ids=job_ids, first_seen=fields["first_seen"],
        last_seen=fields["last_seen"], representative=representative,
        repro=f"/v1/jobs/{representative}/artifacts/repro.py", dashboard=f"/#/bugs/{fields['id']}",
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
        bugs = []
        for index in range(0, len(replies), 3):
            fields, job_ids, count = replies[index:index + 3]
            if fields.get("representative"):
                bugs.append(_bug(fields, job_ids, count))
        return bugs

    async def get(self, bug_id: str) -> Bug | None:
        found = await self._read([bug_id])
        return found[0] if found else None

    async def page(self, offset: int, limit: int) -> tuple[list[Bug], int]:
        """Bugs, most recently seen first."""
        total = await self.redis.zcard(BUGS_KEY)
        bug_ids = await self.redis.zrevrange(BUGS_KEY, offset, offset + limit - 1)
        return await self._read(bug_ids), total

    async def count(self) -> int:
        return await self.redis.zcard(BUGS_KEY)

    async def representatives(self) -> set[str]:
        """The job of every listed bug that stands for it: retention keeps these."""
        bug_ids = await self.redis.zrange(BUGS_KEY, 0, -1)
        async with self.redis.pipeline(transaction=False) as pipe:
            for bug_id in bug_ids:
                pipe.hget(bug_record_key(bug_id), "representative")
            return {job_id for job_id in await pipe.execute() if job_id}

    async def file_unfiled(self, jobs: list[tuple[str, str]]) -> int:
        """File succeeded jobs that no worker filed, `(job id, finished_at)`: a job queued before the
        server knew of bugs (its ticket names no bug keys) and run by a worker that does. The key is
        computed from its report (minify_client.bugs.bug_key), as the worker computes it. Returns the
        jobs filed."""
        filed = 0
        for job_id, finished_at in jobs:
            result = await self.redis.hget(record_key(job_id), "result")
            report = Report.model_validate_json(result) if result else None
            if report is None:
                continue
            async with self.redis.pipeline(transaction=True) as pipe:
                if add_to_bug_index(pipe, ticket_keys(job_id), job_id, report, finished_at):
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
                    pipe.delete(bug_record_key(bug_id), bug_jobs_key(bug_id))
                await pipe.execute()
        return bug_ids
