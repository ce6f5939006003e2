"""A graph's identity: `structural_hash` (one candidate: the scheduler's memo key) and
`graph_shape_hash` (what a bug is made of: minify_contract.bugs groups jobs by it), one digest
and one argument writer for both.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import torch.fx as fx

from minify_contract.fx.form import (
    META_KIND,
    META_NARROW,
    META_SCALAR,
    META_TENSOR,
    META_VALUE,
    subgraph_of,
)
from minify_contract.fx.targets import target_name


def structural_hash(graph: fx.Graph) -> str:
    """Hash invariant to node names: nodes numbered in order, placeholders by minify_value (and the
    sizes they are narrowed to, when shrunk: two sizes are two candidates)."""

    def placeholder(node: fx.Node) -> str:
        narrow = f" narrow {node.meta[META_NARROW]!r}" if META_NARROW in node.meta else ""
        return f"{node.meta.get(META_VALUE, node.target)!r}{narrow}"

    return _digest(graph, placeholder, exact=True)


def graph_shape_hash(graph: fx.Graph) -> str:
    """Hash of what a bug is made of, not of one instance of it: the ops, the edges between them, and
    each input's kind, dtype and device; not node names, not the inputs' value keys, not tensor sizes
    (an int or a float argument counts by its type, so a view to another size is the same shape).
    Two programs that minimize to the same graph at other sizes share it (minify_contract.bugs)."""

    def placeholder(node: fx.Node) -> str:
        tensor = node.meta.get(META_TENSOR) or {}
        return f"{node.meta.get(META_KIND)} {tensor.get('dtype')} {tensor.get('device')} {node.meta.get(META_SCALAR)}"

    return _digest(graph, placeholder, exact=False)


def _digest(graph: fx.Graph, placeholder: Callable[[fx.Node], str], *, exact: bool) -> str:
    """sha256 of one line per node, nodes numbered in order: `placeholder` writes an input,
    `_argument_text` the arguments, a control-flow branch enters by its own digest."""
    index: dict[fx.Node, int] = {}
    lines = []
    for position, node in enumerate(graph.nodes):
        index[node] = position
        if node.op == "placeholder":
            lines.append(f"placeholder {placeholder(node)}")
        elif node.op == "call_function":
            lines.append(f"call {target_name(node.target)} {_argument_text(node.args, index, exact)} "
                         f"{_argument_text(node.kwargs, index, exact)}")
        elif node.op == "get_attr":
            lines.append(f"subgraph {_digest(subgraph_of(node), placeholder, exact=exact)}")
        else:
            lines.append(f"{node.op} {_argument_text(node.args, index, exact)}")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _argument_text(value: Any, index: dict[fx.Node, int], exact: bool) -> str:
    """Unambiguous text of an argument, nodes by position (repr tells 1 from 1.0 and "x"). Not
    `exact`: every int and float by its type (sizes, offsets and constants drop out), tuples as lists."""
    if isinstance(value, fx.Node):
        return f"%{index[value]}"
    if isinstance(value, tuple) and exact:
        return "(" + ",".join(_argument_text(item, index, exact) for item in value) + ",)"
    if isinstance(value, (tuple, list)):
        return "[" + ",".join(_argument_text(item, index, exact) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{key!r}:{_argument_text(item, index, exact)}" for key, item in value.items()) + "}"
    if not exact and isinstance(value, (int, float)) and not isinstance(value, bool):
        return type(value).__name__
    return repr(value)
