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

When export refuses the named dims (a guard of the graph's own that a range cannot say, such as
an even size for `view(2, -1)`), each symbolic dim is exported `Dim.DYNAMIC`, and export infers
the relations. A range unbounded above stays unbounded (export's `int_oo`), as the compile had it.

Relies on (checked on torch 2.13.0): `SymInt.node.expr`, `.node.hint` (None for a data-dependent
size) and `.node.shape_env.var_to_range` (the symbol's range, sympy bounds, `int_oo` when
unbounded), dynamo's `example_value` and AOT's `val` placeholder metadata, `torch.export.Dim` with
derived dims, `Dim.DYNAMIC` for int inputs and, with a range, for tensor dims, and `aten.sym_size.int`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DynamicProgram:
    """The graph exported with its symbolic sizes, and the inputs it takes (size inputs dropped)."""

    program: Any  # torch.export.ExportedProgram
    inputs: tuple[Any, ...]


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
    """Whether any value is a symbolic int or a tensor with a symbolic size: the compile was dynamic."""
    return any(_symbolic_int(value) or _symbolic_dims(value) for value in values)


def export_dynamic(module: Any, inputs: Sequence[Any], symbolic: Sequence[Any]) -> DynamicProgram:
    """Export `module` (a GraphModule) over `inputs` with the symbolic sizes its placeholders were
    compiled with (`symbolic`). First with one named Dim per symbol and the compile's ranges; when
    export refuses them (a guard of the graph's own, `s % 2 == 0`, that a range cannot say), with
    `Dim.DYNAMIC` for each symbolic dim, which lets export infer such relations. Raises what the
    last export raised, or `ValueError` for a size no export can take (a data-dependent one)."""
    import torch

    _refuse_data_dependent(symbolic)
    module, kept = _tie_size_inputs(_sums_as_additions(module), symbolic)
    kept_inputs = tuple(inputs[position] for position in kept)
    kept_symbolic = [symbolic[position] for position in kept]
    try:
        shapes = _dynamic_shapes(kept_symbolic, named=True)
        return DynamicProgram(torch.export.export(module, kept_inputs, dynamic_shapes=shapes, strict=False),
                              kept_inputs)
    except Exception as refused:  # a constraint violation, mostly: the guard is in the message
        logger.info("minify: exporting with the compile's named dims failed, trying Dim.DYNAMIC: %s", refused)
    shapes = _dynamic_shapes(kept_symbolic, named=False)
    return DynamicProgram(torch.export.export(module, kept_inputs, dynamic_shapes=shapes, strict=False), kept_inputs)


def _sums_as_additions(module: Any) -> Any:
    """`module` with each `torch.sym_sum` (dynamo's `sum()` of sizes) as a chain of `+`: export
    keeps the node, and `torch.export.save` cannot write it ("Failed serializing node sym_sum", a
    BEiT's or a Wav2Vec2's relative positions under dynamic=True); `operator.add` it can."""
    import operator

    import torch
    import torch.fx as fx

    if not any(node.op == "call_function" and node.target is torch.sym_sum for node in module.graph.nodes):
        return module
    graph = fx.Graph()
    copied: dict[fx.Node, Any] = {}
    for node in module.graph.nodes:
        if node.op == "call_function" and node.target is torch.sym_sum:
            terms = [copied[term] if isinstance(term, fx.Node) else term for term in node.args[0]]
            total = terms[0] if terms else 0
            for term in terms[1:]:
                total = graph.call_function(operator.add, (total, term))
            copied[node] = total
        else:
            copied[node] = graph.node_copy(node, lambda arg: copied[arg])
    return fx.GraphModule(module, graph)


def specialize_floats(module: Any, inputs: Sequence[Any],
                      symbolic: Sequence[Any]) -> tuple[Any, tuple[Any, ...], list[Any]]:
    """`module` with the floats dynamo made symbolic passed as constants: `module`, `inputs` and
    `symbolic` without those inputs. Dynamo passes such a float (a module's `eps`, dropout's `p`,
    under `dynamic=True` with a backend other than inductor) as a 0-d float64 tensor the graph reads
    with `.item()`; export cannot guard on the value read (dropout's `p < 0` check), so neither a
    dynamic nor a static export would take the graph. Each read becomes the example's value, as
    inductor does when it specializes a float."""
    import torch
    import torch.fx as fx

    placeholders = [node for node in module.graph.nodes if node.op == "placeholder"]
    values: dict[fx.Node, float] = {}
    for position, node in enumerate(placeholders):
        value = inputs[position] if position < len(inputs) else None
        if (isinstance(value, torch.Tensor) and value.dim() == 0 and value.dtype == torch.float64 and node.users
                and all(user.op == "call_method" and user.target == "item" for user in node.users)):
            values[node] = value.item()
    if not values:
        return module, tuple(inputs), list(symbolic)
    graph = fx.Graph()
    copied: dict[fx.Node, Any] = {}
    for node in module.graph.nodes:
        if node in values:
            continue
        if node.op == "call_method" and node.args[0] in values:
            copied[node] = values[node.args[0]]
        else:
            copied[node] = graph.node_copy(node, lambda arg: copied[arg])
    kept = [position for position, node in enumerate(placeholders) if node not in values]
    return (fx.GraphModule(module, graph), tuple(inputs[position] for position in kept),
            [symbolic[position] for position in kept if position < len(symbolic)])


def _dynamic_shapes(symbolic: Sequence[Any], *, named: bool) -> tuple[Any, ...]:
    """`dynamic_shapes` for inputs compiled with `symbolic`: per tensor `{dim: Dim}` for its symbolic
    dims (named after their symbol, or `Dim.DYNAMIC`), `Dim.DYNAMIC` for a symbolic int (export
    takes no named Dim for an int), None for anything static."""
    import torch

    dims: dict[Any, Any] = {}
    shapes: list[Any] = []
    for value in symbolic:
        if _symbolic_int(value):
            shapes.append(torch.export.Dim.DYNAMIC)
        elif sizes := _symbolic_dims(value):
            shapes.append({dim: _dim_for(size, dims) if named else _dynamic_hint(size)
                           for dim, size in sizes.items()})
        else:
            shapes.append(None)
    return tuple(shapes)


def _symbolic_int(value: Any) -> bool:
    """A SymInt that is still a symbol (not one the compile specialized to a constant)."""
    import torch

    return isinstance(value, torch.SymInt) and bool(value.node.expr.free_symbols)


def _symbolic_dims(value: Any) -> dict[int, Any]:
    """The dims of a tensor whose sizes are still symbolic."""
    import torch

    if not isinstance(value, torch.Tensor):
        return {}
    return {dim: size for dim, size in enumerate(value.shape) if _symbolic_int(size)}


def _refuse_data_dependent(symbolic: Sequence[Any]) -> None:
    """An input sized by a value computed in another graph (an unbacked symbol, `u0`) has no
    example size to export it with."""
    for value in symbolic:
        sizes = [value] if _symbolic_int(value) else list(_symbolic_dims(value).values())
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
        if _symbolic_int(value) and value.node.expr in sizes:
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

    low, high = _range(symbol, shape_env)
    return torch.export.Dim(str(symbol), min=low, max=high)


def _dynamic_hint(size: Any) -> Any:
    """`Dim.DYNAMIC` within the range of the size's symbol (a wider one for any other expression)."""
    import torch

    symbols = list(size.node.expr.free_symbols)
    low, high = _range(symbols[0], size.node.shape_env) if len(symbols) == 1 else (None, None)
    return torch.export.Dim.DYNAMIC(min=low, max=high)


def _range(symbol: Any, shape_env: Any) -> tuple[int | None, int | None]:
    """The compile's range of `symbol`, None at an end it leaves unbounded: the Dim then takes
    export's default there (`int_oo` above), so the program says what the compile did. (The
    engine and repro.py give `mark_dynamic` the end it needs: `backends.dynamo_range`.)"""
    bound = shape_env.var_to_range.get(symbol) if shape_env is not None else None
    lower = int(bound.lower) if bound is not None and bound.lower.is_Integer else None
    upper = int(bound.upper) if bound is not None and bound.upper.is_Integer else None
    return (max(lower, 0) if lower is not None else None), upper
