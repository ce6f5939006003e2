"""The shrink phase of a StableHLO module: once it is minimal, its tensor sizes halve while the
failure holds. Pure functions (the engine's process) but the phase's loop.

A candidate halves one size everywhere it appears as a tensor dimension (every `tensor<...>` in
the args, the ops' text and the types), so a module whose ops tie two dims together stays
consistent; the argument values are sliced to the new sizes (their leading part) when a child
builds the candidate (`run.candidate_inputs`), never made up. A size the ops also name in
attributes (a slice's limits, a reshape's constant) makes a candidate that does not verify:
`Invalid`, not accepted. Largest sizes first, each halved to 1 at most.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from minify_contract.models import Milestone
from minify_worker.programs.candidates import Candidate

from .module import Module, Value, tensor_shape

_DIMS = re.compile(r"tensor<((?:\d+x)+)")


def sizes(module: Module) -> list[int]:
    """The tensor dimension sizes over 1 the module's arguments have, largest first."""
    found = set()
    for value in module.args:
        shape = tensor_shape(value.type)
        if shape is not None:
            found.update(size for size in shape[0] if size > 1)
    return sorted(found, reverse=True)


def elements(module: Module) -> tuple[int, ...]:
    """What the phase decreases: the arguments' elements in all."""
    total = 0
    for value in module.args:
        shape = tensor_shape(value.type)
        if shape is not None:
            total += math.prod(shape[0])
    return (total,)


def resize(module: Module, old: int, new: int) -> Module:
    """`module` with every tensor dimension of size `old` made `new`."""
    def dims(match: re.Match[str]) -> str:
        parts = [str(new) if part == str(old) else part for part in match[1].split("x") if part]
        return "tensor<" + "".join(f"{part}x" for part in parts)

    def retype(text: str) -> str:
        return _DIMS.sub(dims, text)

    ops = tuple(replace(op, body=retype(op.body), results=tuple(Value(v.key, retype(v.type)) for v in op.results))
                for op in module.ops)
    return replace(module, ops=ops, args=tuple(Value(v.key, retype(v.type)) for v in module.args),
                   types={key: retype(text) for key, text in module.types.items()})


def candidates(module: Module) -> Iterator[Candidate]:
    for size in sizes(module):
        yield Candidate(resize(module, size, size // 2), f"halve size {size} to {size // 2}")  # type: ignore[arg-type]


def shapes_text(module: Module) -> str:
    return ", ".join(f"{value.key} {value.type}" for value in module.args) or "no arguments"


def shrink(scheduler: Any, module: Module, *, say: Callable[[Milestone, str], None],
           on_accept: Callable[[Module, str], None]) -> None:
    """Halve sizes while the failure holds, each accepted candidate through `on_accept`."""
    if not sizes(module):
        say(Milestone.shrink_skipped, "shrink skipped: no argument has a dimension over 1")
        return
    say(Milestone.shrink_started, f"shrinking {shapes_text(module)}")
    started = scheduler.stats.checks_total
    current, accepted = module, 0
    while True:
        candidate = scheduler.first_failing(current, candidates(current), size=elements)
        if candidate is None:
            break
        current, accepted = candidate.graph, accepted + 1
        on_accept(current, candidate.description)
    checks = scheduler.stats.checks_total - started
    say(Milestone.shrunk, f"shrunk to {shapes_text(current)} in {checks} checks" if accepted
        else f"no size could shrink ({checks} checks)")
