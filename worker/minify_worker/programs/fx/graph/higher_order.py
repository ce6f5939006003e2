"""Higher-order ops (cond, while_loop, invoke_subgraph, wrap, tag_activation_checkpoint): inlining a
subgraph in place of the op, and editing one subgraph; which graphs keep custom autograd.Functions
(`autograd_function_apply`, a forward and a backward subgraph: `holds_autograd_functions`).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from minify_contract.fx.form import (
    META_SUBGRAPH,
    META_TAKEN,
    subgraph_of,
)
from minify_contract.fx.targets import target_name
from minify_worker.programs.fx.graph.form import _BODY_OPS, _node, copy_graph, outputs, placeholders
from minify_worker.programs.fx.graph.surgery import derive, drop_node


def holds_autograd_functions(graph: fx.Graph) -> bool:
    """Whether `graph` (or a subgraph of it) calls `autograd_function_apply`: a custom
    autograd.Function, forward and backward, as dynamo hands it to a compiler. torch.export and
    make_fx trace through it and keep its forward only."""
    for node in graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.higher_order.autograd_function_apply:
            return True
        if node.op == "get_attr" and holds_autograd_functions(subgraph_of(node)):
            return True
    return False


def inlinable_subgraphs(graph: fx.Graph, node_name: str) -> list[str]:
    """The subgraphs (get_attr names) that `inline_subgraph` can put in place of a higher-order op.

    cond: the branch the original run took first (`minify_taken`), then the other; while_loop:
    its body (one iteration); invoke_subgraph, wrap and tag_activation_checkpoint (a checkpointed
    region: the same values, recomputed in the backward): their subgraph. Others (map, scan, flex
    attention) call their subgraphs on slices or scalars: none.
    """
    node = _node(graph, node_name)
    if node.op != "call_function" or not isinstance(node.target, torch._ops.HigherOrderOperator):
        return []
    positions = {
        "higher_order.cond": [1, 2] if node.meta.get(META_TAKEN) != 2 else [2, 1],
        "higher_order.while_loop": [1],
        "higher_order.invoke_subgraph": [0],
        "higher_order.wrap": [0],
        "higher_order.tag_activation_checkpoint": [0],
    }.get(target_name(node.target), [])
    return [node.args[position].name for position in positions
            if position < len(node.args) and isinstance(node.args[position], fx.Node)
            and node.args[position].op == "get_attr"]


def _subgraph_operands(node: fx.Node) -> list[Any]:
    """What a subgraph's placeholders read, in order, for the ops `inlinable_subgraphs` knows."""
    name = target_name(node.target)
    if name == "higher_order.cond":
        return list(node.args[3])
    if name == "higher_order.while_loop":
        return list(node.args[2]) + list(node.args[3])
    if name in ("higher_order.wrap", "higher_order.tag_activation_checkpoint"):
        return list(node.args[1:])  # (subgraph, *operands)
    return list(node.args[2:])  # invoke_subgraph(subgraph, identifier, *operands)


def inline_subgraph(graph: fx.Graph, node_name: str, subgraph_name: str) -> fx.Graph | None:
    """The higher-order op `node_name` replaced by the body of its subgraph `subgraph_name`, called
    once on the op's operands (see `inlinable_subgraphs`), as a canonical candidate.

    The op's `getitem` users read the subgraph's outputs instead. Inlined nodes keep their meta
    (a taken cond branch's ops have values, so they can be promoted); names are made unique. None
    when the op's result is used other than through `getitem` or the arity does not fit.
    """
    by_name = {node.name: node for node in graph.nodes}
    hop = by_name[node_name]
    subgraph = subgraph_of(by_name[subgraph_name])
    operands = _subgraph_operands(hop)
    parameters = placeholders(subgraph)
    results = outputs(subgraph)
    users = list(hop.users)
    if len(operands) != len(parameters) or not all(
            user.target is operator.getitem and isinstance(user.args[1], int)
            and 0 <= user.args[1] < len(results) for user in users):
        return None
    new_graph = fx.Graph()
    env: dict[fx.Node, Any] = {}
    inner: dict[fx.Node, Any] = {}
    for node in graph.nodes:
        if node in users:
            continue
        if node is not hop:
            env[node] = new_graph.node_copy(node, lambda n: env[n])
            env[node].meta = dict(node.meta)
            continue
        inner.update((parameter, env[operand] if isinstance(operand, fx.Node) else operand)
                     for parameter, operand in zip(parameters, operands, strict=True))
        for sub_node in subgraph.nodes:
            if sub_node.op in _BODY_OPS:
                inner[sub_node] = new_graph.node_copy(sub_node, lambda n: inner[n])
                inner[sub_node].meta = dict(sub_node.meta)
                if sub_node.op == "get_attr":
                    inner[sub_node].target = inner[sub_node].name
        for user in users:
            result = results[user.args[1]]
            env[user] = inner[result] if isinstance(result, fx.Node) else result
    return derive(new_graph)


def with_subgraph(graph: fx.Graph, subgraph_name: str, subgraph: fx.Graph) -> fx.Graph:
    """A copy of `graph` whose get_attr node `subgraph_name` stands for `subgraph` instead."""
    new_graph = copy_graph(graph)
    _node(new_graph, subgraph_name).meta[META_SUBGRAPH] = subgraph
    return new_graph


def drop_in_subgraph(subgraph: fx.Graph, node_name: str) -> fx.Graph | None:
    """`subgraph` without the op `node_name` (its users read a same-typed input, `stand_in_for`),
    dead code removed, its placeholders and output arity kept (the op calling it needs them).
    None when the op has no stand-in. The same surgery as `drop_node`: dead-code removal keeps
    placeholders and the output node, so the arity holds."""
    return drop_node(subgraph, node_name)
