"""The program form's vocabulary: the minify_* meta keys a node carries, the error for what the
form cannot hold, and the one query the wire form needs (a get_attr node's subgraph). The worker's
queries over a graph are in `minify_worker.programs.fx.graph.form`."""

from __future__ import annotations

import torch
import torch.fx as fx

META_VALUE = "minify_value"
META_KIND = "minify_kind"
META_TENSOR = "minify_tensor"
META_ROLE = "minify_role"
META_SCALAR = "minify_scalar"
META_TAKEN = "minify_taken"
META_SUBGRAPH = "minify_subgraph"
META_NARROW = "minify_narrow"
META_KEYS = (META_VALUE, META_KIND, META_TENSOR, META_ROLE, META_SCALAR, META_TAKEN, META_NARROW)

PROMOTABLE_KINDS = frozenset({"tensor", "scalar"})


class GraphFormatError(ValueError):
    """A graph (or its wire form) uses something the engine does not accept."""


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.float32` -> "float32"."""
    return str(dtype).removeprefix("torch.")


def subgraph_of(node: fx.Node) -> fx.Graph:
    """The subgraph a get_attr node stands for."""
    subgraph = node.meta.get(META_SUBGRAPH)
    if node.op != "get_attr" or not isinstance(subgraph, fx.Graph):
        raise GraphFormatError(f"node {node.name!r} is not a subgraph")
    return subgraph
