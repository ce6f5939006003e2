"""The key of a bug, and what files a job under it: which succeeded jobs found the same compiler bug.

`bug_key` is the one place the key is computed, by the worker (report.json's `bug`, the index) and
by the server (filing a job a worker left unfiled). A bug is the root-cause signature (as
report.json records it, already normalized by minify_worker/signatures.py: paths, numbers and
generated names taken out) together with the shape of the minimal graph (`graph_shape_hash`: its
ops, edges, dtypes and devices, not its tensor sizes). As ClusterFuzz groups crashes by crash
state, two programs that minimize to the same ops failing the same way are one bug, whatever their
sizes or names.

`add_to_bug_index` queues the index's writes on a Redis transaction, for the worker's job entry (in
the transaction that ends the job) and the server alike. The key names come from the caller: the
server's layout (minify_server/records.py, `ticket_keys`) spells them; this module imports no Redis.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from minify_client.models import Report

BUG_ID_LENGTH = 24


def bug_key(signature: str, graph_shape_hash: str) -> str:
    """The bug id (24 hex digits) of a minimal graph of shape `graph_shape_hash` failing with `signature`."""
    text = f"minify-bug-v1\n{signature.strip()}\n{graph_shape_hash}"
    return hashlib.sha256(text.encode()).hexdigest()[:BUG_ID_LENGTH]


def add_to_bug_index(pipe: Any, keys: Mapping[str, str], job_id: str, report: Report, finished_at: str) -> str | None:
    """Queue on `pipe` (a Redis transaction, sync or async) the writes that file a succeeded job under
    its bug: the bug's record (the first job filed stays its representative), its jobs by finish
    time, the bugs by last seen, and `bug` on the job's record. `keys` are a job ticket's (`record`,
    `bugs`, and the `bug` and `bug_jobs` templates of `{bug}`). Returns the bug id; None (nothing
    queued) for a report without a signature or a graph shape hash."""
    if not report.signature or not report.graph_shape_hash:
        return None
    bug_id = bug_key(report.signature, report.graph_shape_hash)
    bug = keys["bug"].format(bug=bug_id)
    first = {"id": bug_id, "signature": report.signature, "graph_shape_hash": report.graph_shape_hash,
             "failure_kind": report.failure_kind or "", "backend": report.backend, "device": report.device,
             "first_seen": finished_at, "representative": job_id}
    for name, value in first.items():
        pipe.hsetnx(bug, name, value)
    pipe.hset(bug, "last_seen", finished_at)
    seen = datetime.fromisoformat(finished_at).timestamp()
    pipe.zadd(keys["bug_jobs"].format(bug=bug_id), {job_id: seen})
    pipe.zadd(keys["bugs"], {bug_id: seen})
    pipe.hset(keys["record"], "bug", bug_id)
    return bug_id
