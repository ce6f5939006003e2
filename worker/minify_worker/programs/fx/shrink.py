"""The shrink phase: once the graph is 1-minimal, make its tensor inputs smaller (docs/internals.md).

A shrunk candidate is the same graph whose tensor placeholders (original inputs and promoted
intermediates alike) read the leading block of their stored value: the placeholder's
`minify_narrow` holds the sizes (part of its identity: `graph.structural_hash` and the wire form),
and the sandbox child slices the value to them when it builds the candidate (`narrowed`). Slicing,
not fresh random data: embedding indices stay in range, masks stay masks, and the numbers that
tripped a numerical bug are still there.

`shrink` searches round by round through the same scheduler as the reduction, so a candidate counts
only if it fails with the target signature, and several run at once. The first round opens with
every dim of every input at 1 (most compiler bugs do not care about sizes: one check, done). A
round offers, in this order:

1. every dim of every input halved at once (the cheap win: tied sizes, a matmul's K, stay tied);
2. every dim of one size halved at once, largest size first (tied dims, when 1 broke another);
3. one dim of one input halved, largest dim first;
4. every dim of one size but one (tied dims beside a dim of the same size that must stay).

The first one that still fails is taken and the next round starts from it. A dim of size 1 is
left alone; a dim whose halving alone lost the failure is done: not halved alone again, nor in 1
(halve until it stops failing), only with the dims of its size in 2 and 4. The phase ends when a
round shrinks nothing or after `MAX_CHECKS` checks. A graph whose ops bake in sizes (a view to a
literal shape) does not fit a smaller input: the child refuses such a candidate before compiling it
(`check_sizes`), so it does not shrink, whatever the backend does with sizes it never looks at.
Nor does a candidate that raises when run eagerly on its shrunk values where the whole values run
(`check_runs`: an input made smaller than the index another input or a `randperm(n)` reads it
with), so the repro stays a program that runs.

Only static shapes are shrunk: a graph with dims compiled symbolic (`JobSpec.dynamic` other than
"static" over an input with `minify_tensor["dynamic"]`) is left as it is (`not_shrinkable`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx

from minify_contract import zero_tensors
from minify_contract.accuracy import clone_input
from minify_worker.programs.candidates import Candidate
from minify_worker.programs.fx import graph as g

if TYPE_CHECKING:
    from minify_worker.engine.scheduler import Scheduler

# The phase's budget in checks: a size-bound dim of 4096 takes 6 rounds to reach 64, and each round
# may try a few candidates before one fails; when every dim must shrink alone, it bounds the phase.
MAX_CHECKS = 100

Dim = tuple[str, int]
"""One dim of one input: (placeholder name, axis)."""


@dataclass
class Shrinking:
    """What the phase did: the graph it ended with, the candidates it took, the checks it spent."""

    graph: fx.Graph
    accepted: list[str] = field(default_factory=list)
    checks: int = 0


def input_sizes(graph: fx.Graph) -> dict[str, list[int]]:
    """The sizes of the graph's tensor inputs whose sizes are all concrete, by placeholder name."""
    sizes = {}
    for node in g.placeholders(graph):
        tensor = node.meta.get(g.META_TENSOR)
        if node.meta.get(g.META_KIND) != "tensor" or tensor is None:
            continue
        shape = tensor.get("shape", [])
        if all(isinstance(size, int) for size in shape):
            sizes[node.name] = list(shape)
    return sizes


def input_shapes(graph: fx.Graph) -> dict[str, dict[str, Any]]:
    """`{name: {"shape": [...], "dtype": "float32"}}` of the graph's tensor inputs (report.json)."""
    dtypes = {node.name: node.meta[g.META_TENSOR].get("dtype", "") for node in g.placeholders(graph)
              if g.META_TENSOR in node.meta}
    return {name: {"shape": shape, "dtype": dtypes[name]} for name, shape in input_sizes(graph).items()}


def not_shrinkable(graph: fx.Graph, dynamic: str) -> str | None:
    """Why the phase leaves `graph` as it is (`dynamic`: the JobSpec's mode), or None."""
    placeholders = g.placeholders(graph)
    symbolic = [node.name for node in placeholders if (node.meta.get(g.META_TENSOR) or {}).get("dynamic")]
    if symbolic and dynamic != "static":
        return (f"{_names(symbolic)} {'has' if len(symbolic) == 1 else 'have'} dynamic dims (compiled symbolic: "
                f"dynamic={dynamic}); only static shapes are shrunk")
    if not placeholders:
        return "the program has no inputs"
    if not any(size > 1 for sizes in input_sizes(graph).values() for size in sizes):
        tensors = input_sizes(graph)
        others = [node.name for node in placeholders if node.name not in tensors]
        if not tensors:
            return f"no tensor input ({_names(others)}: not tensors)"
        return "every tensor input is already as small as it gets (no dim above 1)"
    return None


def kept_inputs(graph: fx.Graph) -> list[str]:
    """The inputs the phase cannot shrink: not tensors, or without concrete sizes."""
    tensors = input_sizes(graph)
    return [node.name for node in g.placeholders(graph) if node.name not in tensors]


def shrink_key(graph: fx.Graph) -> tuple[int, ...]:
    """What the phase decreases: `graph.size_key`, then the elements of the tensor inputs."""
    return (*g.size_key(graph), sum(math.prod(sizes) for sizes in input_sizes(graph).values()))


def halved(graph: fx.Graph, dims: Iterable[Dim]) -> fx.Graph:
    """A copy of `graph` whose inputs have `dims` halved (rounded down, at least 1): the placeholder's
    `minify_narrow` and its `minify_tensor` shape and stride say the new sizes. The ops' meta keeps
    the original sizes (nothing reads it once the graph is minimal)."""
    return _resized(graph, dims, lambda size: max(1, size // 2))


def to_ones(graph: fx.Graph, dims: Iterable[Dim]) -> fx.Graph:
    """A copy of `graph` whose inputs have `dims` of size 1 (as `halved`)."""
    return _resized(graph, dims, lambda size: 1)


def _resized(graph: fx.Graph, dims: Iterable[Dim], new_size: Callable[[int], int]) -> fx.Graph:
    by_input: dict[str, list[int]] = {}
    for name, axis in dims:
        by_input.setdefault(name, []).append(axis)
    new_graph = g.copy_graph(graph)
    for node in g.placeholders(new_graph):
        if node.name not in by_input:
            continue
        tensor = node.meta[g.META_TENSOR]
        sizes = list(tensor["shape"])
        for axis in by_input[node.name]:
            sizes[axis] = new_size(sizes[axis])
        node.meta[g.META_NARROW] = sizes
        node.meta[g.META_TENSOR] = {**tensor, "shape": sizes, "stride": _dense_stride(sizes, tensor.get("stride"))}
    return new_graph


def _dense_stride(sizes: list[int], stored: list[int] | None) -> list[int]:
    """The strides `narrowed`'s copy has: dense, in the dim order of the `stored` strides (largest
    outermost; row-major when unknown), a dim of size 1 as row-major gives it (a `clone` would keep
    the stored stride there, which a loop's carried-value check tells apart from its body's)."""
    known = stored is not None and len(stored) == len(sizes) and all(isinstance(step, int) for step in stored)
    order = sorted(range(len(sizes)), key=lambda axis: -stored[axis]) if known else list(range(len(sizes)))
    strides = [1] * len(sizes)
    step = 1
    for axis in reversed(order):
        strides[axis] = step
        step *= max(1, sizes[axis])
    return strides


def candidates(graph: fx.Graph, done: set[Dim], *, first: bool = False) -> Iterator[tuple[frozenset[Dim], Candidate]]:
    """One round's candidates in the order they are tried (module docstring), each with the dims it
    changes. Dims of size 1 are left alone; `done` dims are never halved alone again, nor in "every
    dim at once", but still with the other dims of their size (a dim tied to another cannot shrink
    alone). The `first` round opens with every dim at 1."""
    sizes = input_sizes(graph)
    open_dims = [(name, axis) for name, shape in sizes.items() for axis, size in enumerate(shape) if size > 1]
    if first and any(sizes[name][axis] > 3 for name, axis in open_dims):  # else halving gives ones
        ones = to_ones(graph, open_dims)
        yield frozenset(open_dims), Candidate(ones, _description(ones, open_dims))
    by_size: dict[int, list[Dim]] = {}
    for name, axis in open_dims:
        by_size.setdefault(sizes[name][axis], []).append((name, axis))
    tied = [dims for _, dims in sorted(by_size.items(), reverse=True) if len(dims) > 1]
    groups = [[dim for dim in open_dims if dim not in done], *tied]
    groups += [[dim] for dim in sorted(open_dims, key=lambda dim: -sizes[dim[0]][dim[1]]) if dim not in done]
    groups += [[dim for dim in dims if dim != left_out] for dims in tied if len(dims) > 2 for left_out in dims]
    seen: set[frozenset[Dim]] = set()
    for group in groups:
        key = frozenset(group)
        if not key or key in seen:
            continue
        seen.add(key)
        candidate = halved(graph, group)
        yield key, Candidate(candidate, _description(candidate, group))


def shrink(scheduler: Scheduler, graph: fx.Graph, *, max_checks: int = MAX_CHECKS,
           on_accept: Callable[[fx.Graph, str], None] | None = None) -> Shrinking:
    """Halve `graph`'s tensor inputs while the failure holds (module docstring), through `scheduler`.

    Raises `outcomes.Stopped` as the reduction does; what `on_accept` saw stays valid.
    """
    result = Shrinking(graph)
    done: set[Dim] = set()
    started = scheduler.stats.checks_total
    scheduler.stats.strategy = "shrink"
    while (budget := max_checks - (scheduler.stats.checks_total - started)) > 0:
        offered: list[tuple[frozenset[Dim], Candidate]] = []
        offers = islice(_recorded(candidates(result.graph, done, first=not result.accepted), offered), budget)
        chosen = scheduler.first_failing(result.graph, offers, size=shrink_key)
        result.checks = scheduler.stats.checks_total - started
        if chosen is None:
            break
        # Everything offered before the chosen one was tested and lost the failure: a dim whose
        # halving alone did is done.
        for dims, candidate in offered:
            if candidate is chosen:
                break
            if len(dims) == 1:
                done |= dims
        result.graph = chosen.graph
        result.accepted.append(chosen.description)
        if on_accept is not None:
            on_accept(chosen.graph, chosen.description)
    return result


def _recorded(offers: Iterator[tuple[frozenset[Dim], Candidate]],
              offered: list[tuple[frozenset[Dim], Candidate]]) -> Iterator[Candidate]:
    """The candidates of `offers`, each appended to `offered` (with its dims) as it is read."""
    for dims, candidate in offers:
        offered.append((dims, candidate))
        yield candidate


def narrowed(value: Any, sizes: list[int] | None) -> Any:
    """The stored `value` as a shrunk input reads it: the leading `sizes` block of each dim, copied
    dense in the value's dim order (`_dense_stride`: the big storage is not kept alive, nor saved
    in inputs.pt); a ZeroTensor as a ZeroTensor of `sizes` (it has no data: a copy would make it a
    dense tensor, another program), a conjugate or negative view with its bit. `sizes` None: the
    value as stored."""
    if sizes is None:
        return value
    if not isinstance(value, torch.Tensor) or value.dim() != len(sizes) or any(
            size > stored for size, stored in zip(sizes, value.shape, strict=True)):
        shape = list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(f"cannot narrow a stored value of shape {shape} to {sizes}")
    if value.is_conj():  # the block of what it views, viewed with the bit again (a copy resolves it)
        return narrowed(value.conj(), sizes).conj()
    if value.is_neg():
        return torch._neg_view(narrowed(torch._neg_view(value), sizes))
    if value._is_zerotensor():  # no values to slice: a smaller ZeroTensor, never a dense copy
        return zero_tensors.make(sizes, _dense_stride(sizes, list(value.stride())), value.dtype, value.device)
    dense = torch.empty_strided(sizes, _dense_stride(sizes, list(value.stride())), dtype=value.dtype,
                                device=value.device)
    return dense.copy_(value[tuple(slice(0, size) for size in sizes)])


def check_sizes(gm: fx.GraphModule, inputs: list[Any]) -> None:
    """Raise if `gm`'s ops do not fit its inputs' sizes: the graph run on fake tensors of their
    shapes, dtypes and devices (`minify_tensor["device"]`: no data, no kernel, no device touched).

    A backend that fails while compiling without looking at sizes would take any shrunk candidate
    as still failing, a view to a literal size or a loop whose body changes a carried shape
    included; the child runs this on every shrunk candidate first, so such a candidate is
    `Invalid` instead, and the result stays a well-formed program (minimized.pt2 exports).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    devices = [(node.meta.get(g.META_TENSOR) or {}).get("device", "cpu") for node in g.placeholders(gm.graph)]
    mode = FakeTensorMode(shape_env=ShapeEnv())
    with mode:
        fakes = [torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=device)
                 if isinstance(value, torch.Tensor) else value for value, device in zip(inputs, devices, strict=True)]
        gm(*fakes)


def check_runs(gm: fx.GraphModule, inputs: list[Any], whole: list[Any]) -> None:
    """Raise if `gm` raises when run eagerly on `inputs` (shrunk) where it runs on `whole` (the
    values they were sliced from): an input made smaller than the values another input indexes it
    with (a `randperm(n)` or `arange(n)`, an index tensor, embedding ids) is a program that no
    longer runs, whatever a compiler does with it (pytorch#183988's repro, shrunk on fake tensors,
    indexed 1 row with randperm(8)). A graph that raises on its whole values too (a missing error,
    a crash where eager raises: the bug is the compiled program's answer to that error) is kept.

    Runs on the CPU, where the value store keeps the values: an eager index out of bounds on a
    GPU is a device-side assert that would end the child. A graph whose ops name another device
    raises on both and is kept.
    """
    problem = _eager_error(gm, inputs)
    if problem is None or _eager_error(gm, whole) is not None:
        return
    raise ValueError(f"the shrunk inputs make the program raise when run eagerly, where its whole inputs run: "
                     f"{problem}")


def _eager_error(gm: fx.GraphModule, inputs: list[Any]) -> str | None:
    try:
        with torch.no_grad():  # on a copy: an in-place op on a constant attribute changes only the copy
            copy.deepcopy(gm)(*[clone_input(value) if isinstance(value, torch.Tensor) else value
                                for value in inputs])
    except Exception as error:
        return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    return None


def shapes_text(graph: fx.Graph) -> str:
    """"x 256x128, w 128" for the graph's tensor inputs (progress messages)."""
    return _shapes_text(graph, set(input_sizes(graph)))


def _description(candidate: fx.Graph, dims: list[Dim]) -> str:
    """"shrink x to 128x64, w to 64x32": the inputs a candidate changes, with their new sizes."""
    return "shrink " + _shapes_text(candidate, {name for name, _ in dims}, joiner=" to ")


def _shapes_text(graph: fx.Graph, names: set[str], limit: int = 4, joiner: str = " ") -> str:
    shapes = [f"{name}{joiner}{'x'.join(map(str, sizes)) or 'scalar'}" for name, sizes in input_sizes(graph).items()
              if name in names]
    more = f" (+{len(shapes) - limit} more)" if len(shapes) > limit else ""
    return ", ".join(shapes[:limit]) + more


def _names(names: list[str], limit: int = 4) -> str:
    more = f" (+{len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more
