"""From an ExportedProgram to the program form: a flat copy of its graph, each node's meta derived
from its `val` (tensor meta, dynamic dims with the program's ranges, scalar types), placeholders
given their role from the graph signature.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.fx as fx

from minify_contract.accuracy import is_dtype_assert
from minify_contract.fx.form import (
    META_KIND,
    META_ROLE,
    META_SCALAR,
    META_SUBGRAPH,
    META_TENSOR,
    META_VALUE,
    PROMOTABLE_KINDS,
    GraphFormatError,
    dtype_name,
)
from minify_contract.fx.targets import target_name


def flat_graph_from_exported_program(ep: torch.export.ExportedProgram) -> fx.Graph:
    """Copy `ep.graph_module.graph` with only minify_* meta, derived from each node's `val`.

    Placeholders get `minify_role` from the graph signature: "parameter", "buffer",
    "constant", "custom_obj", "token" or "input".
    """
    return _flat_copy(ep.graph_module, _input_roles(ep), ep.range_constraints)


def flat_graph_from_module(module: fx.GraphModule) -> fx.Graph:
    """Copy the graph of `module` (aten ops, as `make_fx` traces them, each node's `val` set) as
    `flat_graph_from_exported_program` does; every placeholder is an input, no dim is dynamic."""
    return _flat_copy(module, {}, {})


def _flat_copy(module: fx.GraphModule, roles: dict[str, str] | None, ranges: Mapping[Any, Any]) -> fx.Graph:
    """`module`'s graph with minify meta, its subgraphs (get_attr) flattened the same way.

    Its placeholders are `module`'s, in order (a name may change: see below); each node's
    `minify_value` is its name in the copy.

    `roles` is None for a subgraph: its nodes get no `minify_value` (the loader adds the keys of
    the values it recorded inside a taken branch).
    """
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in module.graph.nodes:
        # torch.export's dtype asserts are not the program's (dynamo's graph has none), and can be
        # wrong about it: in an autocast region's body (`wrap_with_autocast`) export saw float32 where
        # the region makes bfloat16, and the program failed its own eager run on one.
        if is_dtype_assert(node):
            continue
        if node.op not in ("placeholder", "call_function", "get_attr", "output"):
            raise GraphFormatError(
                f"node {node.name!r} is a {node.op}: only placeholder, call_function, get_attr "
                "(of a subgraph) and output nodes are supported"
            )
        if node.op == "call_function":
            target_name(node.target)  # refuse what the wire form could not carry
        new_node = graph.node_copy(node, lambda n: env[n])
        if node.op == "placeholder":
            # The copy renames a name that shadows a Python builtin or keyword (`input` becomes
            # `input_1`, as nn.Sequential's argument does): the placeholder's target, the
            # forward's argument, follows, and the values are keyed by the new name.
            new_node.target = new_node.name
        new_node.meta = _minify_meta(new_node, ranges)
        if roles is None:
            new_node.meta.pop(META_VALUE, None)
        if node.op == "placeholder" and roles is not None:
            new_node.meta[META_ROLE] = roles.get(node.name, "input")
        elif node.op == "get_attr":
            new_node.target = new_node.name
            new_node.meta[META_SUBGRAPH] = _flat_copy(_subgraph_module(module, node), None, ranges)
        env[node] = new_node
    graph.lint()
    return graph


def _subgraph_module(module: fx.GraphModule, node: fx.Node) -> fx.GraphModule:
    try:
        value = module.get_submodule(str(node.target))
    except AttributeError:
        value = None
    if not isinstance(value, fx.GraphModule):
        raise GraphFormatError(f"node {node.name!r} reads attribute {node.target!r}, which is not a "
                               "subgraph (only get_attr nodes of higher-order ops' subgraphs are supported)")
    return value


def _input_roles(ep: torch.export.ExportedProgram) -> dict[str, str]:
    from torch.export.graph_signature import InputKind

    names = {
        InputKind.PARAMETER: "parameter",
        InputKind.BUFFER: "buffer",
        InputKind.CONSTANT_TENSOR: "constant",
        InputKind.CUSTOM_OBJ: "custom_obj",
        InputKind.TOKEN: "token",
        InputKind.USER_INPUT: "input",
    }
    roles = {}
    for spec in ep.graph_signature.input_specs:
        name = getattr(spec.arg, "name", None)
        if name is not None:
            roles[name] = names.get(spec.kind, "input")
    return roles


def _minify_meta(node: fx.Node, ranges: Mapping[Any, Any]) -> dict[str, Any]:
    if node.op == "output":
        return {META_KIND: "other"}
    if "val" not in node.meta:
        return {META_KIND: "none" if node.op == "call_function" and _returns_none(node) else "other"}
    val = node.meta["val"]
    meta: dict[str, Any] = {}
    if isinstance(val, torch.Tensor):
        meta[META_KIND] = "tensor"
        meta[META_TENSOR] = tensor_meta(val)
        dynamic = dynamic_dims(val, ranges, node.name)
        if dynamic:
            meta[META_TENSOR]["dynamic"] = dynamic
    elif isinstance(val, (bool, int, float, torch.SymInt, torch.SymFloat, torch.SymBool)):
        meta[META_KIND] = "scalar"
        meta[META_SCALAR] = _scalar_type(val)
    elif isinstance(val, (tuple, list)):
        meta[META_KIND] = "tuple"
    elif val is None:
        meta[META_KIND] = "none"
    else:
        meta[META_KIND] = "other"
    if node.op == "placeholder" or meta[META_KIND] in PROMOTABLE_KINDS:
        meta[META_VALUE] = node.name
    return meta


def _scalar_type(value: object) -> str:
    if isinstance(value, (bool, torch.SymBool)):
        return "bool"
    return "int" if isinstance(value, (int, torch.SymInt)) else "float"


def _returns_none(node: fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return schema is not None and len(schema.returns) == 0


def tensor_meta(value: torch.Tensor) -> dict[str, Any]:
    """JSON-safe description of a (possibly fake, possibly symbolic) tensor."""
    return {
        "shape": [_concrete_int(size) for size in value.shape],
        "dtype": dtype_name(value.dtype),
        "device": str(value.device),
        "stride": [_concrete_int(stride) for stride in value.stride()],
    }


def dynamic_dims(value: torch.Tensor, ranges: Mapping[Any, Any], owner: str) -> dict[str, dict[str, Any]]:
    """The symbolic dims of a fake tensor, by dim (a string: JSON keys), for the compile to keep.

    A size `scale * s + offset` of one symbol `s` is `{"name": "s", "min", "max"}` with `s`'s range
    from the program's `range_constraints` (None when unbounded), and `"scale"`, `"offset"` when not
    1 and 0: dims of the same symbol stay one dim (export's `Dim` and derived `Dim`). Any other
    expression is a dim of its own, `{"name": "<owner>_<dim>", "min", "max", "expr"}`, bounded by
    the expression's range.
    """
    import sympy
    from torch.utils._sympy.value_ranges import bound_sympy

    known = {symbol: bound for symbol, bound in ranges.items() if isinstance(symbol, sympy.Symbol)}
    dims: dict[str, dict[str, Any]] = {}
    for axis, size in enumerate(value.shape):
        if not isinstance(size, torch.SymInt) or not isinstance(size.node.expr, sympy.Expr):
            continue
        expr = size.node.expr
        if expr.is_number:
            continue
        symbols = list(expr.free_symbols)
        linear = _linear_in(expr, symbols[0]) if len(symbols) == 1 else None
        if linear is not None:
            (scale, offset), symbol = linear, symbols[0]
            dim = {"name": str(symbol), **_bounds(bound_sympy(symbol, known))}
            dim.update({"scale": scale} if scale != 1 else {})
            dim.update({"offset": offset} if offset != 0 else {})
        else:
            dim = {"name": f"{owner}_{axis}", **_bounds(bound_sympy(expr, known)), "expr": str(expr)}
        dims[str(axis)] = dim
    return dims


def _linear_in(expr: Any, symbol: Any) -> tuple[int, int] | None:
    """(scale, offset) when `expr` is `scale * symbol + offset` with integers, scale > 0."""
    import sympy

    expanded = sympy.expand(expr)
    try:
        scale, offset = expanded.coeff(symbol), expanded.subs(symbol, 0)
    except ArithmeticError:  # `64 // s` at s = 0 (a Swin's windows): not linear in s
        return None
    if not (isinstance(scale, sympy.Integer) and isinstance(offset, sympy.Integer)) or scale <= 0:
        return None
    return (int(scale), int(offset)) if sympy.expand(expr - scale * symbol - offset) == 0 else None


def _bounds(bound: Any) -> dict[str, int | None]:
    from torch.utils._sympy.numbers import int_oo

    def finite(value: Any) -> int | None:
        return None if value in (int_oo, -int_oo) or not value.is_number or not value.is_finite else int(value)

    return {"min": finite(bound.lower), "max": finite(bound.upper)}


def _concrete_int(value: int | torch.SymInt) -> int | str:
    if isinstance(value, torch.SymInt):
        hint = getattr(value.node, "hint", None)
        return int(hint) if hint is not None else str(value)
    return int(value)
