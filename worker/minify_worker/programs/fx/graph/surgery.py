"""Graph surgery, pure (copy in, copy out): dead code and unused inputs out, outputs pruned, nodes
promoted to inputs, ops dropped or extracted, chains cut; `derive` fuses them into one copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch.fx as fx

from minify_contract.fx.form import (
    META_KEYS,
    META_KIND,
    META_ROLE,
    META_TENSOR,
    PROMOTABLE_KINDS,
)
from minify_worker.programs.fx.graph.form import (
    _BODY_OPS,
    _node,
    _rebuild,
    copy_graph,
    is_mutating,
    is_promotable,
    output_node,
    outputs,
)


def _with_output(graph: fx.Graph, values: Sequence[Any]) -> fx.Graph:
    new_graph = copy_graph(graph)
    old_output = output_node(new_graph)
    by_name = {node.name: node for node in new_graph.nodes}

    def remap(value: Any) -> Any:
        return by_name[value.name] if isinstance(value, fx.Node) else value

    with new_graph.inserting_before(old_output):
        new_output = new_graph.output(tuple(remap(value) for value in values))
    new_output.meta = dict(old_output.meta)
    new_graph.erase_node(old_output)
    return new_graph


def _live_nodes(graph: fx.Graph) -> set[fx.Node]:
    """Nodes the outputs (or an argument-mutating op) need, placeholders included."""
    live: set[fx.Node] = set()
    stack = [node for node in graph.nodes if node.op == "output" or is_mutating(node)]
    while stack:
        node = stack.pop()
        if node not in live:
            live.add(node)
            stack.extend(node.all_input_nodes)
    return live


def eliminate_dead_code(graph: fx.Graph) -> fx.Graph:
    """Drop call_function nodes whose value nobody uses.

    Unlike `fx.Graph.eliminate_dead_code`, side-effect-only nodes (asserts, profiler marks) go
    too: a minimized program needs none of them. Ops that mutate an argument stay.
    """
    live = _live_nodes(graph)
    return _rebuild(graph, lambda node: node.op not in _BODY_OPS or node in live)


def remove_unused_inputs(graph: fx.Graph) -> fx.Graph:
    """Drop placeholders nothing reads."""
    return _rebuild(graph, lambda node: node.op != "placeholder" or bool(node.users))


def consolidate_inputs(graph: fx.Graph) -> fx.Graph:
    """Move every placeholder to the front, keeping their relative order."""
    return _rebuild(graph, lambda node: True, order=_inputs_first(graph.nodes))


def _inputs_first(nodes: Iterable[fx.Node]) -> list[fx.Node]:
    nodes = list(nodes)
    return [n for n in nodes if n.op == "placeholder"] + [n for n in nodes if n.op != "placeholder"]


def canonicalize(graph: fx.Graph) -> fx.Graph:
    """Dead code out, unused inputs out, inputs first (in one copy): every candidate's form."""
    return derive(graph)


def derive(graph: fx.Graph, *, cut: str | None = None, keep_outputs: Sequence[int] | None = None,
           promote: Iterable[str] = (), bypass: Mapping[str, str] | None = None,
           output_names: Sequence[str] | None = None, also_output: Sequence[str] = ()) -> fx.Graph:
    """A canonical candidate in one copy: the fused form of the primitives below.

    `cut`: output only that node, dropping everything after it (`truncate_after`).
    `keep_outputs`: keep only these output positions (`prune_outputs`).
    `output_names`: output exactly these nodes instead (`extract`).
    `also_output`: append these nodes to the outputs (`cut_chain`: keeps them alive).
    `promote`: these nodes become placeholders (names from `promotion_targets`).
    `bypass`: {node: stand-in}: users of the node read the stand-in instead (`drop_node`).
    The result is canonical (`canonicalize`): live nodes only, placeholders first, in order.
    """
    nodes = list(graph.nodes)
    by_name = {node.name: node for node in nodes}
    stand_ins = {by_name[name]: by_name[other] for name, other in (bypass or {}).items()}
    promoted = {by_name[name] for name in promote}

    def resolve(node: fx.Node) -> fx.Node:
        while node in stand_ins:
            node = stand_ins[node]
        return node

    if cut is not None:
        last = nodes.index(by_name[cut])
        values: list[Any] = [by_name[cut]]
    else:
        last = len(nodes) - 1
        values = outputs(graph)
        if keep_outputs is not None:
            values = [values[index] for index in keep_outputs]
        if output_names is not None:
            values = [by_name[name] for name in output_names]
    values += [by_name[name] for name in also_output]
    values = [resolve(value) if isinstance(value, fx.Node) else value for value in values]
    stack = [value for value in values if isinstance(value, fx.Node)]
    stack += [node for node in nodes[: last + 1] if is_mutating(node) and node not in stand_ins]
    live: set[fx.Node] = set()
    while stack:
        node = stack.pop()
        if node not in live:
            live.add(node)
            if node not in promoted:
                stack.extend(resolve(arg) for arg in node.all_input_nodes)

    inputs = [n for n in nodes if n in live and (n.op == "placeholder" or n in promoted)]
    body = [n for n in nodes if n in live and n.op in _BODY_OPS and n not in promoted]
    new_graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in inputs + body:
        if node in promoted:
            env[node] = _promoted_placeholder(new_graph, node)
        else:
            env[node] = new_graph.node_copy(node, lambda arg: env[resolve(arg)])
            env[node].meta = dict(node.meta)
    new_output = new_graph.output(tuple(env[v] if isinstance(v, fx.Node) else v for v in values))
    new_output.meta = dict(output_node(graph).meta)
    return new_graph


def _promoted_placeholder(new_graph: fx.Graph, node: fx.Node) -> fx.Node:
    new_node = new_graph.create_node("placeholder", node.name, name=node.name)
    new_node.meta = {key: node.meta[key] for key in META_KEYS if key in node.meta}
    new_node.meta[META_ROLE] = "promoted"
    return new_node


def truncate_after(graph: fx.Graph, node_name: str) -> fx.Graph:
    """Keep the nodes up to `node_name`; the output is that single node. Then DCE."""
    nodes = list(graph.nodes)
    cut = next((i for i, node in enumerate(nodes) if node.name == node_name), None)
    if cut is None:
        raise KeyError(f"no node named {node_name!r}")
    if nodes[cut].op != "call_function":
        raise ValueError(f"cannot truncate after {nodes[cut].op} {node_name!r}")
    kept = set(nodes[: cut + 1])
    new_graph = _rebuild(graph, lambda node: node in kept)
    new_graph.output((_node(new_graph, node_name),)).meta = {META_KIND: "other"}
    return eliminate_dead_code(new_graph)


def promotion_targets(graph: fx.Graph, node_names: Iterable[str]) -> list[str]:
    """The nodes that promoting `node_names` really promotes, in graph order.

    A promotable node stands for itself; a tuple-valued node (e.g. `aten.max.dim`) stands for
    its promotable `getitem` users, as torch's delta debugging does; anything else for nothing.
    """
    wanted: set[str] = set()
    by_name = {node.name: node for node in graph.nodes}
    for name in node_names:
        node = by_name[name]
        if is_promotable(node):
            wanted.add(name)
        elif node.op == "call_function" and node.meta.get(META_KIND) == "tuple":
            wanted.update(user.name for user in node.users if is_promotable(user))
    return [node.name for node in graph.nodes if node.name in wanted]


def promote_to_inputs(graph: fx.Graph, node_names: Iterable[str]) -> fx.Graph:
    """Turn nodes into placeholders of the same name (see `promotion_targets`).

    The placeholders stay where the nodes were (`consolidate_inputs` moves them); their
    `minify_value` and tensor meta are kept, their role is "promoted". Nothing is DCE'd.
    """
    targets = promotion_targets(graph, node_names)
    if not targets:
        raise ValueError(f"none of {list(node_names)!r} can be promoted to an input")

    return _rebuild(graph, lambda node: True, replace=dict.fromkeys(targets, _promoted_placeholder))


def remove_outputs(graph: fx.Graph, indices: Iterable[int]) -> fx.Graph:
    """Drop the outputs at `indices` (positions in the flat output tuple). No DCE."""
    dropped = set(indices)
    return _with_output(graph, [v for i, v in enumerate(outputs(graph)) if i not in dropped])


def prune_outputs(graph: fx.Graph, keep: Iterable[int]) -> fx.Graph:
    """Keep only the outputs at `keep`, in their order, then DCE and drop unused inputs."""
    values = outputs(graph)
    return remove_unused_inputs(eliminate_dead_code(_with_output(graph, [values[i] for i in keep])))


def drop_node(graph: fx.Graph, node_name: str) -> fx.Graph | None:
    """Remove an op: its users read `stand_in_for(node)` instead. None when there is none.

    The result is DCE'd (not otherwise canonicalized).
    """
    stand_in = stand_in_for(graph, node_name)
    if stand_in is None:
        return None
    new_graph = copy_graph(graph)
    new_node = _node(new_graph, node_name)
    new_node.replace_all_uses_with(_node(new_graph, stand_in))
    new_graph.erase_node(new_node)
    return eliminate_dead_code(new_graph)


def stand_in_for(graph: fx.Graph, node_name: str) -> str | None:
    """An input of the op with the same shape, stride, dtype and device, that could replace it
    (a different stride could break a later `view`); None when there is none."""
    node = _node(graph, node_name)
    meta = node.meta.get(META_TENSOR)
    if node.op != "call_function" or node.meta.get(META_KIND) != "tensor" or meta is None:
        return None
    return next((arg.name for arg in node.all_input_nodes
                 if arg.meta.get(META_KIND) == "tensor" and _same_type(arg.meta.get(META_TENSOR), meta)),
                None)


def _same_type(left: dict[str, Any] | None, right: dict[str, Any]) -> bool:
    return left is not None and all(left.get(key) == right.get(key)
                                    for key in ("shape", "stride", "dtype", "device"))


def is_output_value(node: fx.Node) -> bool:
    """Whether `node` can be an output of a candidate: an op producing one tensor or scalar."""
    return node.op == "call_function" and node.meta.get(META_KIND) in PROMOTABLE_KINDS


def extract(graph: fx.Graph, node_names: Iterable[str]) -> fx.Graph | None:
    """The ops `node_names` alone, as a canonical candidate; None when it would output nothing.

    What they read from outside becomes an input (promoted); an outside op that cannot be promoted
    (a tuple-valued op such as `aten.max.dim` under a kept `getitem`) comes along instead. The
    outputs are the kept ops whose value left the kept set: read by an op outside it, returned by
    the graph, or read by nobody.
    """
    nodes = list(graph.nodes)
    by_name = {node.name: node for node in nodes}
    kept = {by_name[name] for name in node_names}
    stack = list(kept)
    while stack:
        node = stack.pop()
        for arg in node.all_input_nodes:
            if arg.op == "call_function" and arg not in kept and not is_promotable(arg):
                kept.add(arg)
                stack.append(arg)
    promoted = {arg.name for node in kept for arg in node.all_input_nodes
                if arg.op == "call_function" and arg not in kept}
    boundary = [node.name for node in nodes if node in kept and is_output_value(node)
                and (not node.users or any(user not in kept for user in node.users))]
    if not boundary:
        return None
    return derive(graph, promote=promoted, output_names=boundary)


def cut_chain(graph: fx.Graph, node_name: str) -> fx.Graph | None:
    """Promote `node_name` to an input and keep its producers alive as extra outputs.

    Plain promotion loses the ops upstream of the node when nothing else reads them (DCE drops
    them); this keeps both ends of a chain, so `a -> b -> c` can become `a` and `c` apart. None
    when no producer would die (plain promotion is then the same candidate) or nothing promotes.
    """
    targets = promotion_targets(graph, [node_name])
    if not targets:
        return None
    promoted = derive(graph, promote=targets)
    surviving = {node.name for node in promoted.nodes}
    by_name = {node.name: node for node in graph.nodes}
    producers = {arg.name for name in targets for arg in by_name[name].all_input_nodes
                 if is_output_value(arg) and arg.name not in surviving}
    if not producers:
        return None
    ordered = [node.name for node in graph.nodes if node.name in producers]
    return derive(graph, promote=targets, also_output=ordered)
