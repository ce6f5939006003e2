"""The key of a bug: which succeeded jobs found the same compiler bug.

`bug_key` is the one place the key is computed, by the worker (report.json's `bug`, the index) and
by the server (filing a job a worker left unfiled). A bug is the root-cause signature (as
report.json records it, already normalized by minify_contract/signatures.py: paths, numbers and
generated names taken out) together with the shape of the minimal graph (`graph_shape_hash`: its
ops, edges, dtypes and devices, not its tensor sizes). As ClusterFuzz groups crashes by crash
state, two programs that minimize to the same ops failing the same way are one bug, whatever their
sizes or names.

Filing a job under its bug is a Redis write, the service's: minify_contract/ledger.py
(`add_to_bug_index`) calls `bug_key`; this module imports no Redis.
"""

from __future__ import annotations

import hashlib

BUG_ID_LENGTH = 24


def bug_key(signature: str, graph_shape_hash: str) -> str:
    """The bug id (24 hex digits) of a minimal graph of shape `graph_shape_hash` failing with `signature`."""
    text = f"minify-bug-v1\n{signature.strip()}\n{graph_shape_hash}"
    return hashlib.sha256(text.encode()).hexdigest()[:BUG_ID_LENGTH]

