"""Minimization strategies: pure generators of smaller candidate graphs (docs/internals.md).

A strategy is `Callable[[fx.Graph, StrategyContext], Iterator[Candidate]]`. It never runs
anything: it proposes candidates, in the order it prefers them, each strictly smaller than the
graph it was given (`graph.size_key`) and in canonical form (`graph.canonicalize`: no dead code,
no unused inputs, inputs first), so equal candidates hash equal wherever they come from.

How the scheduler drives them (`scheduler.reduce` with `PASSES` does exactly this):

0. Run `OPENING_STRATEGIES` (bisection over op kinds, probes of one op per kind, bisection
   over topological ranges) the same way as step 1, once, at the start: they aim at a bug one op
   triggers (found in about log2(ops) checks) and find nothing, quickly, when it needs several.
1. Run `DEFAULT_STRATEGIES` in list order on the current graph. For each strategy, test its
   candidates and accept the first one *in yield order* that still fails. After an acceptance,
   start again from the first strategy on the new graph.
2. When no default strategy yields a failing candidate, run `FINAL_STRATEGIES` the same way; any
   acceptance there sends the loop back to step 1 (a dropped op can open new truncations).
3. When neither tier yields a failing candidate the graph is 1-minimal: no single op can be
   dropped, promoted to an input, or cut out of a chain (promoted with its producers kept as
   outputs), no suffix truncated, no output removed, no higher-order op replaced by its
   subgraph inlined, no op dropped inside a subgraph (a higher-order op is one op of its graph).

`DEFAULT_STRATEGIES` reproduce torch's minifier (torch/_functorch/fx_minifier.py), including its
candidate order, which decides results such as the seed's accuracy-vs-strict expectations:
truncation and delta debugging are interleaved per granularity (coarse to fine), never all
truncations first. Generators are lazy: a candidate costs a graph copy only when the scheduler
asks for it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Iterator

import torch.fx as fx

from minify_worker.programs.candidates import Candidate, Strategy, StrategyContext, Tier, chunk_sizes
from minify_worker.programs.fx import graph as g

# --------------------------------------------------------------------------------------------
# Shared helpers


def _can_fail(graph: fx.Graph, context: StrategyContext) -> bool:
    """False when the candidate provably cannot show the failure (see StrategyContext)."""
    if not context.accuracy:
        return True
    return any(_compared(value) for value in g.outputs(graph))


def _compared(value: object) -> bool:
    """Whether the accuracy oracle compares this output: anything but a None."""
    if isinstance(value, fx.Node):
        return value.meta.get(g.META_KIND) != "none"
    return value is not None


class _Proposals:
    """Filters one strategy run's candidates: smaller than the start, new, able to fail."""

    def __init__(self, graph: fx.Graph, context: StrategyContext) -> None:
        self.context = context
        self.size = g.size_key(graph)
        self.seen = {g.structural_hash(graph)}

    def offer(self, candidate_graph: fx.Graph, description: str) -> Iterator[Candidate]:
        if g.size_key(candidate_graph) >= self.size:
            return
        if not _can_fail(candidate_graph, self.context):
            return
        key = g.structural_hash(candidate_graph)
        if key in self.seen:
            return
        self.seen.add(key)
        yield Candidate(candidate_graph, description)


def granularities(graph: fx.Graph, context: StrategyContext) -> list[int]:
    """Torch's chunk sizes: the largest power of two <= the node count (all nodes), halving to 1."""
    return chunk_sizes(len(graph.nodes), context)


def _is_output_candidate(node: fx.Node) -> bool:
    return node.op == "call_function" and node.meta.get(g.META_KIND) in g.PROMOTABLE_KINDS


# --------------------------------------------------------------------------------------------
# Single-granularity candidate streams (torch's strategies)


def truncations_at(graph: fx.Graph, context: StrategyContext, granularity: int,
                   proposals: _Proposals | None = None) -> Iterator[Candidate]:
    """Cut at node indices that are odd multiples of `granularity`; the cut node is the output.

    Indices count every node (placeholders and output included), as torch does; coarser
    granularities already tried the even multiples.
    """
    proposals = proposals or _Proposals(graph, context)
    for index, node in enumerate(graph.nodes):
        if index % granularity == 0 and index % (2 * granularity) != 0 and _is_output_candidate(node):
            candidate = g.derive(graph, cut=node.name)
            yield from proposals.offer(candidate, f"truncate after {node.name} (granularity {granularity})")


def promotions_at(graph: fx.Graph, context: StrategyContext, granularity: int,
                  proposals: _Proposals | None = None) -> Iterator[Candidate]:
    """Delta debugging: promote each chunk of `granularity` consecutive nodes to inputs."""
    proposals = proposals or _Proposals(graph, context)
    nodes = list(graph.nodes)
    for start in range(0, len(nodes), granularity):
        chunk = [node.name for node in nodes[start:start + granularity]]
        targets = g.promotion_targets(graph, chunk)
        if not targets:
            continue
        candidate = g.derive(graph, promote=targets)
        yield from proposals.offer(candidate, f"promote {_names(targets)} to inputs (granularity {granularity})")


def output_removals_at(graph: fx.Graph, context: StrategyContext, granularity: int,
                       proposals: _Proposals | None = None) -> Iterator[Candidate]:
    """Drop chunks of `granularity` outputs, taken in the graph order of the nodes they return."""
    proposals = proposals or _Proposals(graph, context)
    values = g.outputs(graph)
    if len(values) <= 1:
        return
    position = {node: index for index, node in enumerate(graph.nodes)}
    order = sorted(range(len(values)),
                   key=lambda i: position.get(values[i], len(position)) if isinstance(values[i], fx.Node)
                   else len(position))
    for start in range(0, len(order), granularity):
        dropped = order[start:start + granularity]
        candidate = g.derive(graph, keep_outputs=[i for i in range(len(values)) if i not in dropped])
        yield from proposals.offer(candidate, f"remove outputs {sorted(dropped)}")


def _names(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"


# --------------------------------------------------------------------------------------------
# Strategies


def eliminate_dead_code(graph: fx.Graph, context: StrategyContext) -> Iterator[Candidate]:
    """Remove ops no output needs (one candidate, when there are any)."""
    yield from _Proposals(graph, context).offer(g.eliminate_dead_code(graph), "eliminate dead code")


def remove_unused_inputs(graph: fx.Graph, context: StrategyContext) -> Iterator[Candidate]:
    """Remove inputs nothing reads (one candidate, when there are any)."""
    yield from _Proposals(graph, context).offer(g.remove_unused_inputs(graph), "remove unused inputs")


def consolidate_inputs(graph: fx.Graph, context: StrategyContext) -> Iterator[Candidate]:
    """Move inputs to the front (one candidate, when some are not)."""
    yield from _Proposals(graph, context).offer(g.consolidate_inputs(graph), "consolidate inputs")


def truncate_and_delta_debug(graph: fx.Graph, context: StrategyContext) -> Iterator[Candidate]:
    """Torch's granular loop: for each granularity, coarse to fine, try (in this order)
    removing chunks of outputs (only when outputs are more than half the nodes), truncating the
    suffix, and promoting chunks of nodes to inputs."""
    proposals = _Proposals(graph, context)
    many_outputs = len(g.outputs(graph)) > len(graph.nodes) // 2
    for granularity in granularities(graph, context):
        if many_outputs:
            yield from output_removals_at(graph, context, max(1, granularity // 2), proposals)
        yield from truncations_at(graph, context, granularity, proposals)
        yield from promotions_at(graph, context, granularity, proposals)


def truncate_suffix(graph: fx.Graph, context: StrategyContext) -> Iterator[Candidate]:
    """Truncation alone at every granularity (for callers that want it without delta debugging)."""
    proposals = _Proposals(graph, context)
    for granularity in granularities(graph, context):
        yield from truncations_at(graph, context, granularity, proposals)


def remove_outputs(graph: fx.Graph, context: StrategyContext) -> Iterator[Candidate]:
    """Drop one output at a time (torch's last resort before stopping)."""
    yield from output_removals_at(graph, context, 1)


def keep_single_output(graph: fx.Graph, context: StrategyContext) -> Iterator[Candidate]:
    """Keep just one output, each in turn: the smallest possible output set first."""
    proposals = _Proposals(graph, context)
    values = g.outputs(graph)
    if len(values) <= 1:
        return
    for index, value in enumerate(values):
        if isinstance(value, fx.Node):
            yield from proposals.offer(g.derive(graph, keep_outputs=[index]),
                                       f"keep only output {index} ({value.name})")


def one_minimal(graph: fx.Graph, context: StrategyContext) -> Iterator[Candidate]:
    """For every op, in graph order: drop it (its users read a same-typed input instead),
    promote it to an input, or cut the chain there (promote it and keep its producers as extra
    outputs, `graph.cut_chain`). Torch can do none but the promotion from the middle of a graph."""
    proposals = _Proposals(graph, context)
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        stand_in = g.stand_in_for(graph, node.name)
        if stand_in is not None:
            yield from proposals.offer(g.derive(graph, bypass={node.name: stand_in}),
                                       f"drop {node.name} (users read {stand_in})")
        targets = g.promotion_targets(graph, [node.name])
        if targets:
            yield from proposals.offer(g.derive(graph, promote=targets),
                                       f"promote {node.name} to an input")
        cut = g.cut_chain(graph, node.name)
        if cut is not None:
            yield from proposals.offer(cut, f"cut the chain at {node.name} (its producers become outputs)")


# --------------------------------------------------------------------------------------------
# Higher-order ops (torch.cond, while_loop, ...): one op each, their subgraphs minimized too


def _higher_order_ops(graph: fx.Graph) -> list[fx.Node]:
    return [node for node in graph.nodes
            if node.op == "call_function" and g.target_name(node.target).startswith("higher_order.")]


def inline_control_flow(graph: fx.Graph, context: StrategyContext) -> Iterator[Candidate]:
    """Replace a higher-order op by one of its subgraphs, inlined (`graph.inline_subgraph`): a
    cond by the branch taken, then by the other; a while_loop by one iteration of its body. The
    control flow stays when the failure needs it (these candidates pass)."""
    proposals = _Proposals(graph, context)
    for node in _higher_order_ops(graph):
        for subgraph in g.inlinable_subgraphs(graph, node.name):
            candidate = g.inline_subgraph(graph, node.name, subgraph)
            if candidate is not None:
                yield from proposals.offer(candidate, f"inline {subgraph} in place of {node.name}")


def simplify_subgraphs(graph: fx.Graph, context: StrategyContext) -> Iterator[Candidate]:
    """Drop one op inside a subgraph (its users read a same-typed input, `graph.drop_in_subgraph`),
    keeping the subgraph's inputs and outputs. Never an op a while_loop's condition depends on
    (its condition, and what its body computes for the carried values the condition reads):
    dropping the op that moves the loop on would make it run forever."""
    proposals = _Proposals(graph, context)
    for holder in g.subgraphs(graph):
        subgraph = g.subgraph_of(holder)
        protected = _loop_control(holder)
        for node in list(subgraph.nodes):
            if node.op != "call_function" or protected is None or node.name in protected:
                continue
            smaller = g.drop_in_subgraph(subgraph, node.name)
            if smaller is not None:
                yield from proposals.offer(g.with_subgraph(graph, holder.name, smaller),
                                           f"drop {node.name} in {holder.name}")


def _loop_control(holder: fx.Node) -> set[str] | None:
    """The ops of `holder`'s subgraph that decide when a while_loop using it stops: None for the
    whole subgraph (the loop's condition), else the body's ops the condition's inputs come from."""
    protected: set[str] = set()
    for user in holder.users:
        if g.target_name(user.target) != "higher_order.while_loop":
            continue
        condition, body = user.args[0], user.args[1]
        if holder is condition or not isinstance(condition, fx.Node):
            return None
        if holder is body:
            read = [index for index, node in enumerate(g.placeholders(g.subgraph_of(condition))) if node.users]
            results = g.outputs(g.subgraph_of(holder))
            stack = [results[index] for index in read if index < len(results) and isinstance(results[index], fx.Node)]
            while stack:
                node = stack.pop()
                if node.name not in protected:
                    protected.add(node.name)
                    stack.extend(node.all_input_nodes)
    return protected


# --------------------------------------------------------------------------------------------
# Aiming strategies: a bug one op triggers is found in about log2(ops) checks


def _op_groups(graph: fx.Graph) -> dict[str, list[str]]:
    """Ops by first appearance, each with the getitems that read it: {op: [op, getitems...]}."""
    groups: dict[str, list[str]] = {}
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        producer = node.args[0] if node.target is operator.getitem and node.args else None
        if isinstance(producer, fx.Node) and producer.name in groups:
            groups[producer.name].append(node.name)
        else:
            groups[node.name] = [node.name]
    return groups


def _kinds(graph: fx.Graph) -> dict[str, list[str]]:
    """{op kind: the ops of that kind, as `_op_groups` keys}, kinds by first appearance."""
    by_name = {node.name: node for node in graph.nodes}
    kinds: dict[str, list[str]] = {}
    for op in _op_groups(graph):
        kinds.setdefault(g.target_name(by_name[op].target), []).append(op)
    return kinds


def _halves(items: list[str]) -> list[list[str]]:
    middle = (len(items) + 1) // 2
    return [items[:middle], items[middle:]] if len(items) >= 2 else []


def _extracted(graph: fx.Graph, ops: Iterable[str], groups: dict[str, list[str]],
               proposals: _Proposals, description: str) -> Iterator[Candidate]:
    candidate = g.extract(graph, [name for op in ops for name in groups[op]])
    if candidate is not None:
        yield from proposals.offer(candidate, description)


def _balanced_kind_halves(kinds: dict[str, list[str]]) -> list[list[str]]:
    """The op kinds in two groups of about equal op counts: each kind, most ops first, goes to the
    group with fewer ops so far (halving the kinds by their number would leave most of a graph
    in one half when a few kinds hold most of its ops, as convolutions do in a CNN)."""
    halves: list[list[str]] = [[], []]
    counts = [0, 0]
    for kind in sorted(kinds, key=lambda kind: -len(kinds[kind])):
        lighter = counts.index(min(counts))
        halves[lighter].append(kind)
        counts[lighter] += len(kinds[kind])
    order = {kind: index for index, kind in enumerate(kinds)}
    ordered = sorted((sorted(half, key=order.__getitem__) for half in halves if half), key=lambda half: order[half[0]])
    return ordered if len(kinds) >= 2 else []


# Ops a compiler hands to a library (inductor's extern kernels) instead of generating code for.
# Each ends a fusion group, so a candidate's compile costs about one generated kernel per such op
# and little for the pointwise ops between them: of resnet's opening quarters (about 63 ops each),
# the two with its convolutions compiled 6 and 8 C++ kernels (7 and 14 s), the two with its
# pointwise ops 1 and 2 (2 and 3 s).
# Their names as export's default IR has them (`conv2d`, `linear`) and as core aten does.
_LIBRARY_CALLS = frozenset({
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "convolution",
    "_convolution", "convolution_backward", "linear", "bilinear", "matmul", "einsum", "mm", "addmm", "bmm",
    "baddbmm", "_int_mm", "_scaled_mm", "_weight_int8pack_mm", "scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
})


def _library_calls(kind: str) -> bool:
    """Whether ops of `kind` ("aten.convolution.default") are `_LIBRARY_CALLS`."""
    namespace, _, rest = kind.partition(".")
    return namespace == "aten" and rest.partition(".")[0] in _LIBRARY_CALLS


def bisect_kinds(graph: fx.Graph, context: StrategyContext) -> Iterator[Candidate]:
    """Keep the ops of half the op kinds, halved again by position: about a quarter of the ops
    each (the other ops' results become inputs). An opening cut is a compile of its size, so it
    never costs near a full-size compile: a bug one op triggers is in one quarter; halves of a
    graph of a few dominant kinds (halved by the kinds' number) were nearly the whole graph.

    The quarters come cheapest compile first (fewest `_LIBRARY_CALLS` ops; graph order among
    equals). The first one that fails is kept, so its answer is always awaited: with the cheaper
    first, a failure there ends the opening at its cost, with the dearer ones cancelled, and a
    pass costs nothing more, the dearer ones having run beside it. Resnet's injected relu bug,
    first quarter by graph order its convolutions (a pass, 11 s), took its opening from 11 s to 3."""
    proposals = _Proposals(graph, context)
    groups = _op_groups(graph)
    kinds = _kinds(graph)
    quarters = []
    for half in _balanced_kind_halves(kinds):
        members = {op for kind in half for op in kinds[kind]}
        ops = [op for op in groups if op in members]  # graph order
        parts = _halves(ops) or [ops]
        for index, part in enumerate(parts):
            where = "" if len(parts) == 1 else (" (first half by position)" if index == 0 else
                                                " (second half by position)")
            quarters.append((part, f"keep the ops of kinds {_names(half)}{where}"))
    cost = _library_call_count(graph)
    for part, description in sorted(quarters, key=lambda quarter: cost(quarter[0])):  # stable: graph order among equals
        yield from _extracted(graph, part, groups, proposals, description)


def probe_kinds(graph: fx.Graph, context: StrategyContext) -> Iterator[Candidate]:
    """One op of each kind alone, its inputs promoted: the first op of the first
    `context.parallelism` kinds (one batch of the scheduler)."""
    proposals = _Proposals(graph, context)
    groups = _op_groups(graph)
    for kind, ops in list(_kinds(graph).items())[: max(1, context.parallelism)]:
        yield from _extracted(graph, ops[:1], groups, proposals, f"probe {ops[0]} ({kind}) alone")


def bisect_ranges(graph: fx.Graph, context: StrategyContext) -> Iterator[Candidate]:
    """Keep the first half of the ops in graph order, then the second (results crossing become
    inputs and outputs); the half with fewer `_LIBRARY_CALLS` ops first, as `bisect_kinds` orders."""
    proposals = _Proposals(graph, context)
    groups = _op_groups(graph)
    for half in sorted(_halves(list(groups)), key=_library_call_count(graph)):
        yield from _extracted(graph, half, groups, proposals, f"keep ops {half[0]} to {half[-1]}")


def _library_call_count(graph: fx.Graph) -> Callable[[list[str]], int]:
    """How many of a cut's ops (names in `graph`) are `_LIBRARY_CALLS`: about what its compile costs."""
    by_name = {node.name: node for node in graph.nodes}
    return lambda cut: sum(1 for op in cut if _library_calls(g.target_name(by_name[op].target)))


OPENING_STRATEGIES: list[Strategy] = [
    bisect_kinds,
    probe_kinds,
    bisect_ranges,
]

DEFAULT_STRATEGIES: list[Strategy] = [
    eliminate_dead_code,
    remove_unused_inputs,
    consolidate_inputs,
    inline_control_flow,
    truncate_and_delta_debug,
    remove_outputs,
]

FINAL_STRATEGIES: list[Strategy] = [
    keep_single_output,
    one_minimal,
    simplify_subgraphs,
]


PASSES: list[Tier] = [
    Tier.of(OPENING_STRATEGIES, opening=True),
    Tier.of(DEFAULT_STRATEGIES),
    Tier.of(FINAL_STRATEGIES),
]
