"""The program form (see the package's docstring): the queries every other module asks of a graph
(its inputs, outputs, subgraphs, size), copying it, and making it runnable. Its vocabulary (the
minify_* meta keys) is `minify_contract.fx.form`, shared with the capture.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.fx as fx

from minify_contract.fx.form import META_KIND, META_VALUE, PROMOTABLE_KINDS, GraphFormatError, subgraph_of

_BODY_OPS = ("call_function", "get_attr")


def is_float_dtype_name(name: str) -> bool:
    dtype = getattr(torch, name, None)
    return isinstance(dtype, torch.dtype) and dtype.is_floating_point


def count_ops(graph: fx.Graph) -> int:
    """The node count users see: call_function nodes, those of subgraphs included."""
    return sum(1 if node.op == "call_function" else count_ops(subgraph_of(node))
               for node in graph.nodes if node.op in _BODY_OPS)


def subgraphs(graph: fx.Graph) -> list[fx.Node]:
    """The get_attr nodes of `graph` (each a subgraph of a higher-order op)."""
    return [node for node in graph.nodes if node.op == "get_attr"]


def placeholders(graph: fx.Graph) -> list[fx.Node]:
    return [node for node in graph.nodes if node.op == "placeholder"]


def output_node(graph: fx.Graph) -> fx.Node:
    for node in reversed(graph.nodes):
        if node.op == "output":
            return node
    raise GraphFormatError("graph has no output node")


def outputs(graph: fx.Graph) -> list[Any]:
    """The flat list of output values (nodes, or constants such as None)."""
    value = output_node(graph).args[0]
    return list(value) if isinstance(value, (list, tuple)) else [value]


def misplaced_placeholders(graph: fx.Graph) -> int:
    """Placeholders that come after some non-placeholder node (0 when consolidated)."""
    seen_body = False
    count = 0
    for node in graph.nodes:
        if node.op != "placeholder":
            seen_body = True
        elif seen_body:
            count += 1
    return count


def size_key(graph: fx.Graph) -> tuple[int, int, int, int]:
    """What minimization decreases, lexicographically: ops, outputs, inputs, misplaced inputs."""
    return (count_ops(graph), len(outputs(graph)), len(placeholders(graph)),
            misplaced_placeholders(graph))


def is_promotable(node: fx.Node) -> bool:
    """Whether `node` can become an input (its concrete value is in the value store)."""
    return (node.op == "call_function" and META_VALUE in node.meta
            and node.meta.get(META_KIND) in PROMOTABLE_KINDS)


def copy_graph(graph: fx.Graph) -> fx.Graph:
    """A fresh graph with the same nodes, names and (shallow-copied) meta."""
    return _rebuild(graph, lambda node: True)


def to_graph_module(graph: fx.Graph) -> fx.GraphModule:
    """A runnable GraphModule over a copy of `graph`, its subgraphs installed as submodules. One
    that checkpoints (`tag_activation_checkpoint`) is made exportable as the capture makes it
    (`minify_client.capture.higher_order.for_export`): minimized.pt2 and aot_inductor export it."""
    root = torch.nn.Module()
    for node in subgraphs(graph):
        root.add_module(str(node.target), to_graph_module(subgraph_of(node)))
    module = fx.GraphModule(root, copy_graph(graph))
    if any(node.target is torch.ops.higher_order.tag_activation_checkpoint for node in graph.nodes):
        from minify_client.capture.higher_order import for_export

        for_export(module)
    return module


def graph_code(graph: fx.Graph) -> str:
    """Readable Python for `graph`, as FX's `gm.code`, then each subgraph's (`# name:` above it)."""
    parts = [to_graph_module(graph).code.strip()]
    for node in subgraphs(graph):
        parts.append(f"# {node.target}:\n" + graph_code(subgraph_of(node)))
    return "\n\n".join(parts)


def _rebuild(graph: fx.Graph, keep: Callable[[fx.Node], bool],
             replace: dict[str, Callable[[fx.Graph, fx.Node], fx.Node]] | None = None,
             order: Iterable[fx.Node] | None = None) -> fx.Graph:
    """Copy the nodes `keep` accepts, in `order`; `replace[name]` builds a node's stand-in."""
    new_graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    replace = replace or {}
    for node in order if order is not None else graph.nodes:
        if not keep(node):
            continue
        if node.name in replace:
            new_node = replace[node.name](new_graph, node)
        else:
            new_node = new_graph.node_copy(node, lambda n: env[n])
            new_node.meta = dict(node.meta)
        env[node] = new_node
    return new_graph


def _node(graph: fx.Graph, name: str) -> fx.Node:
    for node in graph.nodes:
        if node.name == name:
            return node
    raise KeyError(f"no node named {name!r}")


def is_mutating(node: fx.Node) -> bool:
    """Whether `node` calls an op that writes into an argument (`mul_`, a buffer's `add_`)."""
    schema = getattr(node.target, "_schema", None)
    return schema is not None and schema.is_mutable
