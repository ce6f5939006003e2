"""Filing a result under its bug: the minimal graph's shape hash and the key that groups the jobs
whose minimized graphs are one bug (minify_client.bugs.bug_key)."""

from __future__ import annotations

import torch.fx as fx

from minify_client.bugs import bug_key
from minify_client.models import Report

from ..graph import graph_shape_hash


def file_under_bug(report: Report, graph: fx.Graph) -> None:
    """Set the report's `graph_shape_hash` and `bug` (minify_client.bugs.bug_key) for its minimal graph."""
    report.graph_shape_hash = graph_shape_hash(graph)
    report.bug = bug_key(report.signature, report.graph_shape_hash) if report.signature else None
