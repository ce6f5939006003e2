"""Minimization strategies: pure generators of smaller candidate graphs (docs/internals.md).

A strategy is `Callable[[fx.Graph, StrategyContext], Iterator[Candidate]]`. It never runs
anything: it proposes candidates, in the order it prefers them, each strictly smaller than the
graph it was given (`graph.size_key`) and in canonical form (`graph.canonicalize`: no dead code,
no unused inputs, inputs first), so equal candidates hash equal wherever they come from.

How the scheduler drives them (`scheduler.reduce` with `PASSES` does exactly this):

1. Run `DEFAULT_STRATEGIES` in list order on the current graph. For each strategy, test its
   candidates and accept the first one *in yield order* that still fails. After an acceptance,
   start again from the first strategy on the new graph.
2. When no default strategy yields a failing candidate, run `FINAL_STRATEGIES` the same way; any
   acceptance there sends the loop back to step 1 (a dropped op can open new truncations).
3. When neither tier yields a failing candidate the graph is 1-minimal: no single op can be
   promoted to an input or dropped, no suffix truncated, no output removed.

`DEFAULT_STRATEGIES` reproduce torch's minifier (torch/_functorch/fx_minifier.py), including its
candidate order, which decides results such as the seed's accuracy-vs-strict expectations:
truncation and delta debugging are interleaved per granularity (coarse to fine), never all
truncations first. Generators are lazy: a candidate costs a graph copy only when the scheduler
asks for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch.fx as fx

from minify_worker import graph as g


@dataclass(frozen=True)
class Candidate:
    graph: fx.Graph
    description: str


@dataclass(frozen=True)
class StrategyContext:
    """What strategies may know about the failure being minimized.

    In non-strict accuracy mode (torch's default) only floating-point outputs are compared, so a
    candidate whose outputs are all booleans or integers cannot fail: strategies do not propose
    it. This is the same choice torch ends up with (it tests such candidates and they pass), at
    no cost. `max_granularity` caps the coarsest chunk size, as torch's `--max-granularity`.
    """

    accuracy: bool = False
    strict_accuracy: bool = False
    max_granularity: int | None = None

    @classmethod
    def for_failure(cls, kind: str, strict_accuracy: bool = False,
                    max_granularity: int | None = None) -> StrategyContext:
        return cls(accuracy=kind == "accuracy", strict_accuracy=strict_accuracy,
                   max_granularity=max_granularity)

    @property
    def only_float_outputs_count(self) -> bool:
        return self.accuracy and not self.strict_accuracy


Strategy = Callable[[fx.Graph, StrategyContext], Iterator[Candidate]]


# --------------------------------------------------------------------------------------------
# Shared helpers


def _can_fail(graph: fx.Graph, context: StrategyContext) -> bool:
    """False when the candidate provably cannot show the failure (see StrategyContext)."""
    if not context.only_float_outputs_count:
        return True
    return any(_may_be_float(value) for value in g.outputs(graph))


def _may_be_float(value: object) -> bool:
    if isinstance(value, float):
        return True
    if not isinstance(value, fx.Node):
        return False
    kind = value.meta.get(g.META_KIND)
    if kind == "tensor":
        tensor = value.meta.get(g.META_TENSOR)
        return tensor is None or g.is_float_dtype_name(tensor["dtype"])
    if kind == "scalar":
        return value.meta.get(g.META_SCALAR, "float") == "float"
    return kind != "none"


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
    top = 1 << (len(graph.nodes).bit_length() - 1)
    if context.max_granularity is not None:
        top = min(top, context.max_granularity)
    sizes = []
    while top >= 1:
        sizes.append(top)
        top //= 2
    return sizes


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


def delta_debugging(graph: fx.Graph, context: StrategyContext) -> Iterator[Candidate]:
    """Promotion of node chunks alone at every granularity."""
    proposals = _Proposals(graph, context)
    for granularity in granularities(graph, context):
        yield from promotions_at(graph, context, granularity, proposals)


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
    """For every op, in graph order: drop it (its users read a same-typed input instead), or
    promote it to an input. Torch cannot drop an op from the middle of a graph."""
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


DEFAULT_STRATEGIES: list[Strategy] = [
    eliminate_dead_code,
    remove_unused_inputs,
    consolidate_inputs,
    truncate_and_delta_debug,
    remove_outputs,
]

FINAL_STRATEGIES: list[Strategy] = [
    keep_single_output,
    one_minimal,
]


def named(strategies: Iterable[Strategy]) -> list[tuple[str, Strategy]]:
    """(name, strategy) pairs, as `scheduler.reduce` takes them."""
    return [(strategy.__name__, strategy) for strategy in strategies]


PASSES: list[list[tuple[str, Strategy]]] = [named(DEFAULT_STRATEGIES), named(FINAL_STRATEGIES)]
