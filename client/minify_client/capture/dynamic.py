"""Dynamic captures: a failing graph compiled with symbolic sizes is exported with the same ones.

A compiler that failed under `torch.compile(dynamic=True)`, or on the recompile that automatic
dynamic makes once a size changed, received a graph whose placeholders have symbolic sizes: each
tensor's example value (dynamo's `meta["example_value"]`, AOT autograd's `meta["val"]`, or the
fake input itself) has SymInt dims, and the symbols are lifted to SymInt placeholders (the "size
inputs"). Exported as it ran, each symbol becomes one `torch.export.Dim` named after it, bounded
by the range the compile's ShapeEnv gave it, shared by every dim of that symbol (`a * Dim + b` for
a dim of that form); a size input equal to some tensor input's dim is replaced in the graph by
that tensor's `aten.sym_size.int`, so it stays tied to the tensor it sizes, and a free one (a
Python int dynamo made symbolic) stays an int input exported as `Dim.DYNAMIC`. The program, and
the engine's candidates, minimized.pt2 and repro.py after it, are then dynamic wherever the
compile was.

Relies on (checked on torch 2.13.0): `SymInt.node.expr` and `.node.shape_env.var_to_range` (the
symbol's range, a sympy bound, `int_oo` when unbounded), dynamo's `example_value` and AOT's `val`
placeholder metadata, `torch.export.Dim` with derived dims, `Dim.DYNAMIC` for int inputs, and
`aten.sym_size.int`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DynamicGraph:
    """A graph ready for a dynamic export: the module, its inputs and their `dynamic_shapes`."""

    module: Any  # torch.fx.GraphModule
    inputs: tuple[Any, ...]
    dynamic_shapes: tuple[Any, ...]


def symbolic_values(graph: Any, example_inputs: Sequence[Any]) -> list[Any]:
    """What each placeholder of `graph` (a torch.fx.Graph) was compiled with: its fake example
    value (symbolic sizes included), else the example input itself (fake at the AOT level)."""
    nodes = [node for node in graph.nodes if node.op == "placeholder"]
    values = []
    for position, node in enumerate(nodes):
        value = node.meta.get("example_value", node.meta.get("val"))
        if value is None and position < len(example_inputs):
            value = example_inputs[position]
        values.append(value)
    return values


def is_symbolic(values: Sequence[Any]) -> bool:
    """Whether any value is a SymInt or a tensor with a SymInt size: the compile was dynamic."""
    import torch

    return any(isinstance(value, torch.SymInt) or _symbolic_dims(value) for value in values)


def dynamic_graph(module: Any, inputs: Sequence[Any], symbolic: Sequence[Any]) -> DynamicGraph:
    """`module` with its size inputs tied to the tensors they size, the inputs that remain, and
    `dynamic_shapes` for them: one Dim per symbol, ranged as the compile's ShapeEnv had it.
    Raises `ValueError` for a size no export can take (a data-dependent one)."""
    import torch

    _refuse_data_dependent(symbolic)
    module, kept = _tie_size_inputs(module, symbolic)
    dims: dict[Any, Any] = {}
    shapes = []
    for position in kept:
        value = symbolic[position]
        if isinstance(value, torch.SymInt):
            shapes.append(torch.export.Dim.DYNAMIC)  # free: no tensor dim equals it
        elif isinstance(value, torch.Tensor):
            shapes.append({dim: _dim_for(size, dims) for dim, size in _symbolic_dims(value).items()} or None)
        else:
            shapes.append(None)
    return DynamicGraph(module, tuple(inputs[position] for position in kept), tuple(shapes))


def _symbolic_dims(value: Any) -> dict[int, Any]:
    import torch

    if not isinstance(value, torch.Tensor):
        return {}
    return {dim: size for dim, size in enumerate(value.shape) if isinstance(size, torch.SymInt)}


def _refuse_data_dependent(symbolic: Sequence[Any]) -> None:
    """An input sized by a value computed in another graph (an unbacked symbol, `u0`) has no
    example size to export it with."""
    import torch

    for value in symbolic:
        sizes = [value] if isinstance(value, torch.SymInt) else list(_symbolic_dims(value).values())
        for size in sizes:
            if size.node.hint is None:
                raise ValueError(f"the input size {size.node.expr} is data-dependent")


def _tie_size_inputs(module: Any, symbolic: Sequence[Any]) -> tuple[Any, list[int]]:
    """A copy of `module` where each SymInt placeholder whose value some tensor placeholder has as
    a size is `aten.sym_size.int(tensor, dim)` instead; the positions of the placeholders kept."""
    import torch
    import torch.fx as fx

    placeholders = [node for node in module.graph.nodes if node.op == "placeholder"]
    sizes: dict[Any, tuple[fx.Node, int]] = {}
    for node, value in zip(placeholders, symbolic, strict=False):
        for dim, size in _symbolic_dims(value).items():
            sizes.setdefault(size.node.expr, (node, dim))
    graph = fx.Graph()
    copied: dict[fx.Node, fx.Node] = {}
    tied: dict[fx.Node, tuple[fx.Node, int]] = {}
    kept = []
    for position, node in enumerate(placeholders):
        value = symbolic[position] if position < len(symbolic) else None
        if isinstance(value, torch.SymInt) and value.node.expr in sizes:
            tied[node] = sizes[value.node.expr]
            continue
        copied[node] = graph.node_copy(node, lambda arg: copied[arg])
        kept.append(position)
    for node, (tensor, dim) in tied.items():
        copied[node] = graph.call_function(torch.ops.aten.sym_size.int, (copied[tensor], dim))
        copied[node].meta = dict(node.meta)
    for node in module.graph.nodes:
        if node.op != "placeholder":
            copied[node] = graph.node_copy(node, lambda arg: copied[arg])
    return fx.GraphModule(module, graph), kept


def _dim_for(size: Any, dims: dict[Any, Any]) -> Any:
    """The Dim of a symbolic size: its symbol's (shared), scaled and offset when the size is
    `a * s + b`; `Dim.DYNAMIC` for any other expression (export infers what it can)."""
    import sympy
    import torch

    expr = size.node.expr
    symbols = list(expr.free_symbols)
    if len(symbols) != 1:
        return torch.export.Dim.DYNAMIC
    (symbol,) = symbols
    if symbol not in dims:
        dims[symbol] = _named_dim(symbol, size.node.shape_env)
    if expr == symbol:
        return dims[symbol]
    try:
        polynomial = sympy.Poly(expr, symbol)
    except sympy.PolynomialError:  # floor division, modulo ...
        return torch.export.Dim.DYNAMIC
    if polynomial.degree() != 1 or not all(isinstance(c, sympy.Integer) for c in polynomial.all_coeffs()):
        return torch.export.Dim.DYNAMIC
    scale, offset = polynomial.all_coeffs()
    return int(scale) * dims[symbol] + int(offset)


def _named_dim(symbol: Any, shape_env: Any) -> Any:
    import torch

    bound = shape_env.var_to_range.get(symbol) if shape_env is not None else None
    lower = int(bound.lower) if bound is not None and bound.lower.is_Integer else None
    upper = int(bound.upper) if bound is not None and bound.upper.is_Integer else None
    return torch.export.Dim(str(symbol), min=max(lower, 0) if lower is not None else None, max=upper)
