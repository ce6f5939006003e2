"""What every representation's strategies and the scheduler exchange: a candidate, what strategies
may know about the failure, tiers of strategies, and the chunk sizes of delta debugging.

A strategy is `Callable[[program, StrategyContext], Iterator[Candidate]]`, pure over one
representation's program (an `fx.Graph`, a StableHLO module): it proposes, it never runs anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Candidate:
    """A smaller program a strategy proposes (`graph`: the representation's program, whatever its
    kind) and what was done to get it, for progress events."""

    graph: Any
    description: str


@dataclass(frozen=True)
class StrategyContext:
    """What strategies may know about the failure being minimized.

    In accuracy mode every output is compared, integer and boolean ones exactly
    (`minify_contract.accuracy`), so only a candidate without outputs cannot fail: strategies do
    not propose it. (torch's non-strict rule compared floating-point outputs only: a candidate of
    boolean or integer outputs could not fail there.) `max_granularity` caps the coarsest chunk
    size, as torch's `--max-granularity`.
    `parallelism` is how many candidates the scheduler tests at once (`scheduler.reduce` sets
    it): a strategy that proposes a batch (`probe_kinds`) proposes that many.
    """

    accuracy: bool = False
    max_granularity: int | None = None
    parallelism: int = 1

    @classmethod
    def for_failure(cls, kind: str, max_granularity: int | None = None) -> StrategyContext:
        return cls(accuracy=kind == "accuracy", max_granularity=max_granularity)


Strategy = Callable[[Any, StrategyContext], Iterator[Candidate]]


def chunk_sizes(count: int, context: StrategyContext) -> list[int]:
    """The largest power of two <= `count`, halving to 1, capped by `context.max_granularity`: the
    chunk sizes of truncation and delta debugging, for any representation."""
    top = 1 << (max(count, 1).bit_length() - 1)
    if context.max_granularity is not None:
        top = min(top, context.max_granularity)
    sizes = []
    while top >= 1:
        sizes.append(top)
        top //= 2
    return sizes


@dataclass(frozen=True)
class Tier:
    """Strategies `scheduler.reduce` drives to a fixed point together.

    An `opening` tier runs once, first: after a success in a later tier the loop goes back to the
    first tier that is not an opening, so a failure that needs several ops pays for the aiming
    strategies once, not after every step of the sweep.
    """

    strategies: tuple[tuple[str, Strategy], ...]
    opening: bool = False

    @classmethod
    def of(cls, strategies: Iterable[Strategy], *, opening: bool = False) -> Tier:
        return cls(tuple((strategy.__name__, strategy) for strategy in strategies), opening)

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.strategies]
