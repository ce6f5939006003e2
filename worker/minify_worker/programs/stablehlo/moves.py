"""StableHLO's strategies: pure generators of smaller candidate modules (`candidates.Strategy`
over `module.Module`), driven by `scheduler.reduce` in the tiers of `PASSES`.

The same plan as the FX strategies (programs/fx/moves.py): an opening tier that aims at a bug one op
triggers (bisection over op kinds, one op of a few kinds alone, bisection over op ranges), torch's minifier
(truncation and delta debugging interleaved per granularity, coarse to fine; dead code and
unused arguments; one output less), then 1-minimality (each op promoted to an argument alone,
which for a constant is folding it into an argument; one output kept). An op with regions
(`while`, `case`, `reduce`) is one op: kept or dropped whole.
"""

from __future__ import annotations

from collections.abc import Iterator

from minify_worker.programs.candidates import Candidate, StrategyContext, Tier, chunk_sizes

from . import surgery
from .module import Module, Op, key, size


class _Proposals:
    """Filters one strategy run's candidates: smaller than the start, new, able to fail."""

    def __init__(self, module: Module, context: StrategyContext) -> None:
        self.context = context
        self.size = size(module)
        self.seen = {key(module)}

    def offer(self, candidate: Module | None, description: str) -> Iterator[Candidate]:
        if candidate is None or size(candidate) >= self.size:
            return
        if self.context.accuracy and not candidate.outputs:
            return
        candidate_key = key(candidate)
        if candidate_key in self.seen:
            return
        self.seen.add(candidate_key)
        yield Candidate(candidate, description)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Opening: aim at one op


def _kinds(module: Module) -> dict[str, list[Op]]:
    """The ops of each kind, kinds in order of first appearance."""
    kinds: dict[str, list[Op]] = {}
    for op in module.ops:
        kinds.setdefault(op.kind, []).append(op)
    return kinds


def _balanced_halves(kinds: dict[str, list[Op]]) -> list[list[str]]:
    """The kinds in two groups of about as many ops each (the most frequent placed first)."""
    halves: list[list[str]] = [[], []]
    weights = [0, 0]
    for kind in sorted(kinds, key=lambda name: -len(kinds[name])):
        lighter = 0 if weights[0] <= weights[1] else 1
        halves[lighter].append(kind)
        weights[lighter] += len(kinds[kind])
    return [half for half in halves if half]


def bisect_kinds(module: Module, context: StrategyContext) -> Iterator[Candidate]:
    """Keep the ops of half the kinds, halved again by position: about a quarter of the ops each
    (what they read from the others promoted), as the FX opening does. A bug one op triggers is in
    one quarter, found in about log2(ops) checks."""
    proposals = _Proposals(module, context)
    kinds = _kinds(module)
    if len(kinds) < 2:
        return
    for half in _balanced_halves(kinds):
        members = {op.index for kind in half for op in kinds[kind]}
        ops = [op for op in module.ops if op.index in members]
        middle = len(ops) // 2
        parts = [ops[:middle], ops[middle:]] if middle else [ops]
        for position, part in enumerate(parts):
            where = "" if len(parts) == 1 else (" (first half by position)", " (second half by position)")[position]
            yield from proposals.offer(surgery.keep_ops(module, part), f"keep only {', '.join(half)}{where}")


def probe_kinds(module: Module, context: StrategyContext) -> Iterator[Candidate]:
    """The first op of each of the first `context.parallelism` kinds alone (one batch)."""
    proposals = _Proposals(module, context)
    for kind, ops in list(_kinds(module).items())[: max(1, context.parallelism)]:
        yield from proposals.offer(surgery.keep_ops(module, ops[:1]), f"probe {kind} #{module.ops.index(ops[0])} alone")


def bisect_ranges(module: Module, context: StrategyContext) -> Iterator[Candidate]:
    """Keep the first half of the ops, then the second (its inputs promoted)."""
    proposals = _Proposals(module, context)
    middle = len(module.ops) // 2
    if middle == 0:
        return
    for name, ops in (("first", module.ops[:middle]), ("second", module.ops[middle:])):
        yield from proposals.offer(surgery.keep_ops(module, ops), f"keep the {name} half of the ops")


# --------------------------------------------------------------------------------------------
# Torch's minifier


def eliminate_dead_code(module: Module, context: StrategyContext) -> Iterator[Candidate]:
    """Remove ops no output needs and arguments nothing reads (one candidate, when there are any)."""
    yield from _Proposals(module, context).offer(surgery.canonical(module), "eliminate dead code")


def truncate_and_delta_debug(module: Module, context: StrategyContext) -> Iterator[Candidate]:
    """For each granularity, coarse to fine: truncate after ops at odd multiples of it (the cut
    op is the output), then promote each chunk of that many ops to arguments."""
    proposals = _Proposals(module, context)
    count = len(module.ops)
    for granularity in chunk_sizes(count, context):
        for position in range(granularity - 1, count, 2 * granularity):
            if position + 1 < count:
                yield from proposals.offer(surgery.truncate(module, position),
                                           f"truncate after {module.ops[position].kind} #{position} "
                                           f"(granularity {granularity})")
        for start in range(0, count, granularity):
            chunk = module.ops[start:start + granularity]
            yield from proposals.offer(surgery.promote(module, {op.index for op in chunk}),
                                       f"promote ops {start}..{start + len(chunk) - 1} to arguments "
                                       f"(granularity {granularity})")


def remove_outputs(module: Module, context: StrategyContext) -> Iterator[Candidate]:
    """Drop one output at a time."""
    proposals = _Proposals(module, context)
    if len(module.outputs) > 1:
        for position in range(len(module.outputs)):
            yield from proposals.offer(surgery.drop_outputs(module, {position}), f"remove output {position}")


# --------------------------------------------------------------------------------------------
# 1-minimality


def keep_single_output(module: Module, context: StrategyContext) -> Iterator[Candidate]:
    """Keep just one output, each in turn."""
    proposals = _Proposals(module, context)
    if len(module.outputs) > 1:
        for position, output in enumerate(module.outputs):
            yield from proposals.offer(surgery.subset(module, {op.index for op in module.ops}, [output]),
                                       f"keep only output {position}")


def one_minimal(module: Module, context: StrategyContext) -> Iterator[Candidate]:
    """Each op promoted to an argument alone (its users read its recorded value; a constant
    becomes an argument): no single op can go when none of these fails."""
    proposals = _Proposals(module, context)
    for position, op in enumerate(module.ops):
        yield from proposals.offer(surgery.promote(module, {op.index}),
                                   f"promote {op.kind} #{position} to an argument")


PASSES: list[Tier] = [
    Tier.of([bisect_kinds, probe_kinds, bisect_ranges], opening=True),
    Tier.of([eliminate_dead_code, truncate_and_delta_debug, remove_outputs]),
    Tier.of([keep_single_output, one_minimal]),
]
