"""Candidates of a StableHLO module: a subset of its ops, in canonical form. Pure functions.

`subset` is the one way a candidate is made (truncation, delta debugging, kind and range
bisection, dropping an op all come down to which ops stay and which values are returned): a value
a kept op reads that no kept op computes becomes an argument (an original argument, or an
intermediate whose recorded value the candidate receives), then dead code and unused arguments go.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import replace

from .module import Module, Op, Value


def subset(module: Module, keep: Collection[int], outputs: Sequence[str] | None = None) -> Module | None:
    """The candidate that keeps the ops whose `index` is in `keep` and returns `outputs` (default:
    the module's own, those still computed or promotable). None when it cannot be built: a kept op
    reads a value that is neither computed, an argument, nor recorded (a token, say), or nothing
    would be returned."""
    ops = [op for op in module.ops if op.index in keep]
    computed = {key for op in ops for key in op.result_keys}
    if outputs is None:
        outputs = [key for key in module.outputs if key in computed or _available(module, key)]
    outputs = [key for key in dict.fromkeys(outputs) if key in computed or _available(module, key)]
    if not outputs and not any(not op.results for op in ops):
        return None
    ops = live_ops(ops, outputs)
    computed = {key for op in ops for key in op.result_keys}
    needed: list[str] = []
    for op in ops:
        needed.extend(key for key in op.operands if key not in computed)
    needed.extend(key for key in outputs if key not in computed)
    if any(not _available(module, key) for key in needed):
        return None
    args = sorted(set(needed), key=_argument_order)
    return replace(module, ops=tuple(ops), outputs=tuple(outputs),
                   args=tuple(Value(key, module.types[key]) for key in args))


def _available(module: Module, key: str) -> bool:
    """Whether a candidate can receive `key` as an argument: the original's arguments are in the
    value store, and so are the intermediates whose values were recorded."""
    return key.startswith("a") or key in module.recorded


def _argument_order(key: str) -> tuple[int, int, int]:
    """Original arguments first, by position; then promoted values, in program order."""
    number, _, result = key[1:].partition("#")
    return (0 if key.startswith("a") else 1, int(number), int(result or 0))


def live_ops(ops: Sequence[Op], outputs: Iterable[str]) -> list[Op]:
    """The ops the outputs need, and every op without results (an effect: only dropping it
    explicitly removes it)."""
    wanted = set(outputs)
    live: list[Op] = []
    for op in reversed(ops):
        if not op.results or wanted.intersection(op.result_keys):
            live.append(op)
            wanted.update(op.operands)
    live.reverse()
    return live


def canonical(module: Module) -> Module | None:
    """The module without dead code and unused arguments."""
    return subset(module, {op.index for op in module.ops}, module.outputs)


def sinks(ops: Sequence[Op]) -> list[str]:
    """The results of `ops` that no op of `ops` reads: what a slice of a program returns."""
    read = {key for op in ops for key in op.operands}
    return [key for op in ops for key in op.result_keys if key not in read]


def keep_ops(module: Module, ops: Sequence[Op]) -> Module | None:
    """Only `ops`, returning what they compute that none of them reads."""
    return subset(module, {op.index for op in ops}, sinks(ops))


def truncate(module: Module, position: int) -> Module | None:
    """The ops up to the one at `position`, which is the output."""
    cut = module.ops[position]
    if not cut.results:
        return None
    return subset(module, {op.index for op in module.ops[: position + 1]}, cut.result_keys)


def promote(module: Module, indices: Collection[int]) -> Module | None:
    """Without the ops in `indices`: what they computed is read from arguments (recorded values)."""
    kept = {op.index for op in module.ops if op.index not in indices}
    dropped = {key for op in module.ops if op.index in indices for key in op.result_keys}
    return subset(module, kept, [key for key in module.outputs if key not in dropped])


def drop_outputs(module: Module, positions: Collection[int]) -> Module | None:
    return subset(module, {op.index for op in module.ops},
                  [key for position, key in enumerate(module.outputs) if position not in positions])
