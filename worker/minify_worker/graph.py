"""Graph surgery on flat fx graphs: the program form the engine minimizes (docs/internals.md).

A program is a flat `torch.fx.Graph`: placeholders (parameters, buffers, constants, user inputs
and promoted intermediates), `call_function` nodes, one `output` node returning a flat tuple.
Nodes carry only small JSON-safe meta (`minify_value`, `minify_kind`, `minify_tensor`, and three
additions: `minify_role` on placeholders, `minify_scalar` = "int" | "float" | "bool" on scalar
nodes, `minify_narrow` on a placeholder the shrink phase made smaller: shrink.py), never
FakeTensors, so graphs are cheap to copy and to send to sandbox children.

A higher-order op (`torch.cond`, `while_loop`, `map`, flex attention, ...) is one call_function
node; each subgraph it calls is a `get_attr` node (target = its own name) whose
`meta["minify_subgraph"]` holds the subgraph as a graph of the same form, recursively. Subgraphs
are shared between copies, never mutated: an operation on one builds a new one.

Every operation here is pure: it copies its argument and returns a new graph.
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import math
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx

WIRE_VERSION = 1

META_VALUE = "minify_value"
META_KIND = "minify_kind"
META_TENSOR = "minify_tensor"
META_ROLE = "minify_role"
META_SCALAR = "minify_scalar"
META_TAKEN = "minify_taken"
META_SUBGRAPH = "minify_subgraph"
META_NARROW = "minify_narrow"
_META_KEYS = (META_VALUE, META_KIND, META_TENSOR, META_ROLE, META_SCALAR, META_TAKEN, META_NARROW)

_BODY_OPS = ("call_function", "get_attr")

PROMOTABLE_KINDS = frozenset({"tensor", "scalar"})


class GraphFormatError(ValueError):
    """A graph (or its wire form) uses something the engine does not accept."""


# ---------------------------------------------------------------------------------------------
# From an ExportedProgram


def flat_graph_from_exported_program(ep: torch.export.ExportedProgram) -> fx.Graph:
    """Copy `ep.graph_module.graph` with only minify_* meta, derived from each node's `val`.

    Placeholders get `minify_role` from the graph signature: "parameter", "buffer",
    "constant", "custom_obj", "token" or "input".
    """
    return _flat_copy(ep.graph_module, _input_roles(ep), ep.range_constraints)


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


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.float32` -> "float32"."""
    return str(dtype).removeprefix("torch.")


def is_float_dtype_name(name: str) -> bool:
    dtype = getattr(torch, name, None)
    return isinstance(dtype, torch.dtype) and dtype.is_floating_point


# ---------------------------------------------------------------------------------------------
# Targets: named, resolved from an allowlist


_BUILTIN_NAMES = ("abs", "min", "max", "round", "int", "float", "bool", "len", "pow", "divmod",
                  "sum", "any", "all")
_TORCH_SYM_NAMES = ("sym_float", "sym_int", "sym_max", "sym_min", "sym_not", "sym_ite",
                    "sym_sum", "_sym_sqrt")


def _python_targets() -> dict[str, Callable[..., Any]]:
    targets: dict[str, Callable[..., Any]] = {}
    for module_name, module in (("operator", operator), ("math", math)):
        for name in dir(module):
            value = getattr(module, name)
            if not name.startswith("_") and callable(value) and not isinstance(value, type):
                targets[f"{module_name}.{name}"] = value
    for name in _BUILTIN_NAMES:
        targets[f"builtins.{name}"] = getattr(builtins, name)
    for name in _TORCH_SYM_NAMES:
        if hasattr(torch, name):
            targets[f"torch.{name}"] = getattr(torch, name)
    return targets


_PYTHON_TARGETS = _python_targets()
_PYTHON_TARGET_NAMES = {id(fn): name for name, fn in _PYTHON_TARGETS.items()}


def target_name(target: Any) -> str:
    """Qualified name of a call_function target: "aten.relu.default", "operator.getitem"."""
    name = _PYTHON_TARGET_NAMES.get(id(target))
    if name is not None:
        return name
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return _operator_name(target)
    if isinstance(target, torch._ops.HigherOrderOperator) and target.namespace == "higher_order":
        return f"higher_order.{target.name()}"
    raise GraphFormatError(f"unsupported call_function target {target!r}")


@functools.cache
def _operator_name(target: torch._ops.OpOverload | torch._ops.OpOverloadPacket) -> str:
    return str(target)  # costly (schema parsing), and asked for every node of every hash


def resolve_target(name: str) -> Callable[..., Any]:
    """The callable named by `target_name`; anything outside the allowlist is refused."""
    if name in _PYTHON_TARGETS:
        return _PYTHON_TARGETS[name]
    parts = name.split(".")
    if len(parts) not in (2, 3) or not all(part.isidentifier() for part in parts):
        raise GraphFormatError(f"unknown target {name!r}")
    namespace, *rest = parts
    try:
        resolved: Any = getattr(torch.ops, namespace)
        for part in rest:
            resolved = getattr(resolved, part)
    except (AttributeError, RuntimeError) as error:
        raise GraphFormatError(f"unknown target {name!r}: {error}") from None
    if not isinstance(resolved, (torch._ops.OpOverload, torch._ops.OpOverloadPacket,
                                 torch._ops.HigherOrderOperator)):
        raise GraphFormatError(f"target {name!r} is not an operator overload or higher-order op")
    return resolved


# ---------------------------------------------------------------------------------------------
# Wire form: JSON-safe, no pickle


def graph_to_wire(graph: fx.Graph) -> dict[str, Any]:
    """JSON-safe description of `graph`, readable back by `graph_from_wire`."""
    nodes = []
    for node in graph.nodes:
        entry: dict[str, Any] = {"name": node.name, "op": node.op}
        if node.op == "call_function":
            entry["target"] = target_name(node.target)
        elif node.op == "placeholder":
            entry["target"] = node.target
        elif node.op == "get_attr":
            entry["target"] = node.target
            entry["subgraph"] = graph_to_wire(subgraph_of(node))
        elif node.op != "output":
            raise GraphFormatError(f"node {node.name!r}: unsupported op {node.op!r}")
        entry["args"] = [_encode(arg) for arg in node.args]
        entry["kwargs"] = {key: _encode(value) for key, value in node.kwargs.items()}
        meta = {key: node.meta[key] for key in _META_KEYS if key in node.meta}
        if meta:
            entry["meta"] = meta
        nodes.append(entry)
    return {"version": WIRE_VERSION, "nodes": nodes}


def graph_from_wire(data: dict[str, Any]) -> fx.Graph:
    """Rebuild the graph `graph_to_wire` described; refuses unknown targets and values."""
    if data.get("version") != WIRE_VERSION:
        raise GraphFormatError(f"unsupported wire version {data.get('version')!r}")
    graph = fx.Graph()
    env: dict[str, fx.Node] = {}
    for entry in data["nodes"]:
        op = entry["op"]
        args = tuple(_decode(arg, env) for arg in entry.get("args", []))
        kwargs = {key: _decode(value, env) for key, value in entry.get("kwargs", {}).items()}
        if op == "placeholder":
            target: Any = str(entry["target"])
        elif op == "call_function":
            target = resolve_target(entry["target"])
        elif op == "output":
            target = "output"
        elif op == "get_attr" and entry.get("target") == entry["name"] and "subgraph" in entry:
            target = entry["name"]
        else:
            raise GraphFormatError(f"unsupported op {op!r}")
        node = graph.create_node(op, target, args, kwargs, name=entry["name"])
        if node.name != entry["name"]:
            raise GraphFormatError(f"node name {entry['name']!r} is not usable in a graph")
        node.meta.update(entry.get("meta", {}))
        if op == "get_attr":
            node.meta[META_SUBGRAPH] = graph_from_wire(entry["subgraph"])
        env[node.name] = node
    graph.lint()
    return graph


def _encode(value: Any) -> Any:
    if isinstance(value, fx.Node):
        return {"node": value.name}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return {"float": value if math.isfinite(value) else repr(value)}
    if isinstance(value, complex):
        return {"complex": [_encode(value.real), _encode(value.imag)]}
    if isinstance(value, list):
        return {"list": [_encode(item) for item in value]}
    if isinstance(value, tuple):
        return {"tuple": [_encode(item) for item in value]}
    if isinstance(value, dict):
        return {"dict": [[_encode(key), _encode(item)] for key, item in value.items()]}
    if isinstance(value, torch.dtype):
        return {"dtype": dtype_name(value)}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    if isinstance(value, slice):
        return {"slice": [_encode(value.start), _encode(value.stop), _encode(value.step)]}
    if value is Ellipsis:
        return {"ellipsis": True}
    raise GraphFormatError(f"cannot encode argument of type {type(value).__name__}: {value!r}")


def _decode(value: Any, env: dict[str, fx.Node]) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if not isinstance(value, dict) or len(value) != 1:
        raise GraphFormatError(f"malformed wire value {value!r}")
    ((tag, payload),) = value.items()
    if tag == "node":
        if payload not in env:
            raise GraphFormatError(f"reference to unknown or later node {payload!r}")
        return env[payload]
    if tag == "float":
        return float(payload)
    if tag == "complex":
        return complex(_decode(payload[0], env), _decode(payload[1], env))
    if tag == "list":
        return [_decode(item, env) for item in payload]
    if tag == "tuple":
        return tuple(_decode(item, env) for item in payload)
    if tag == "dict":
        return {_decode(key, env): _decode(item, env) for key, item in payload}
    if tag == "slice":
        return slice(*(_decode(item, env) for item in payload))
    if tag == "ellipsis":
        return Ellipsis
    if tag in ("dtype", "layout", "memory_format"):
        resolved = getattr(torch, str(payload), None)
        expected = {"dtype": torch.dtype, "layout": torch.layout, "memory_format": torch.memory_format}
        if not isinstance(resolved, expected[tag]):
            raise GraphFormatError(f"unknown {tag} {payload!r}")
        return resolved
    if tag == "device":
        try:
            return torch.device(payload)
        except (RuntimeError, TypeError) as error:
            raise GraphFormatError(f"bad device {payload!r}: {error}") from None
    raise GraphFormatError(f"unknown wire tag {tag!r}")


# ---------------------------------------------------------------------------------------------
# Identity and size


def structural_hash(graph: fx.Graph) -> str:
    """Hash invariant to node names: nodes numbered in order, placeholders by minify_value (and the
    sizes they are narrowed to, when shrunk: two sizes are two candidates)."""

    def placeholder(node: fx.Node) -> str:
        narrow = f" narrow {node.meta[META_NARROW]!r}" if META_NARROW in node.meta else ""
        return f"{node.meta.get(META_VALUE, node.target)!r}{narrow}"

    return _digest(graph, placeholder, exact=True)


def graph_shape_hash(graph: fx.Graph) -> str:
    """Hash of what a bug is made of, not of one instance of it: the ops, the edges between them, and
    each input's kind, dtype and device; not node names, not the inputs' value keys, not tensor sizes
    (an int or a float argument counts by its type, so a view to another size is the same shape).
    Two programs that minimize to the same graph at other sizes share it (minify_client.bugs)."""

    def placeholder(node: fx.Node) -> str:
        tensor = node.meta.get(META_TENSOR) or {}
        return f"{node.meta.get(META_KIND)} {tensor.get('dtype')} {tensor.get('device')} {node.meta.get(META_SCALAR)}"

    return _digest(graph, placeholder, exact=False)


def _digest(graph: fx.Graph, placeholder: Callable[[fx.Node], str], *, exact: bool) -> str:
    """sha256 of one line per node, nodes numbered in order: `placeholder` writes an input,
    `_argument_text` the arguments, a control-flow branch enters by its own digest."""
    index: dict[fx.Node, int] = {}
    lines = []
    for position, node in enumerate(graph.nodes):
        index[node] = position
        if node.op == "placeholder":
            lines.append(f"placeholder {placeholder(node)}")
        elif node.op == "call_function":
            lines.append(f"call {target_name(node.target)} {_argument_text(node.args, index, exact)} "
                         f"{_argument_text(node.kwargs, index, exact)}")
        elif node.op == "get_attr":
            lines.append(f"subgraph {_digest(subgraph_of(node), placeholder, exact=exact)}")
        else:
            lines.append(f"{node.op} {_argument_text(node.args, index, exact)}")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _argument_text(value: Any, index: dict[fx.Node, int], exact: bool) -> str:
    """Unambiguous text of an argument, nodes by position (repr tells 1 from 1.0 and "x"). Not
    `exact`: every int and float by its type (sizes, offsets and constants drop out), tuples as lists."""
    if isinstance(value, fx.Node):
        return f"%{index[value]}"
    if isinstance(value, tuple) and exact:
        return "(" + ",".join(_argument_text(item, index, exact) for item in value) + ",)"
    if isinstance(value, (tuple, list)):
        return "[" + ",".join(_argument_text(item, index, exact) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{key!r}:{_argument_text(item, index, exact)}" for key, item in value.items()) + "}"
    if not exact and isinstance(value, (int, float)) and not isinstance(value, bool):
        return type(value).__name__
    return repr(value)


def count_ops(graph: fx.Graph) -> int:
    """The node count users see: call_function nodes, those of subgraphs included."""
    return sum(1 if node.op == "call_function" else count_ops(subgraph_of(node))
               for node in graph.nodes if node.op in _BODY_OPS)


def subgraph_of(node: fx.Node) -> fx.Graph:
    """The subgraph a get_attr node stands for."""
    subgraph = node.meta.get(META_SUBGRAPH)
    if node.op != "get_attr" or not isinstance(subgraph, fx.Graph):
        raise GraphFormatError(f"node {node.name!r} is not a subgraph")
    return subgraph


def subgraphs(graph: fx.Graph) -> list[fx.Node]:
    """The get_attr nodes of `graph` (each a subgraph of a higher-order op)."""
    return [node for node in graph.nodes if node.op == "get_attr"]


def placeholders(graph: fx.Graph) -> list[fx.Node]:
    return [node for node in graph.nodes if node.op == "placeholder"]


def output_node(graph: fx.Graph) -> fx.Node:
    for node in reversed(graph.nodes):
        if node.op == "output":
            return node
    raise GraphFormatError("graph has no output node")


def outputs(graph: fx.Graph) -> list[Any]:
    """The flat list of output values (nodes, or constants such as None)."""
    value = output_node(graph).args[0]
    return list(value) if isinstance(value, (list, tuple)) else [value]


def misplaced_placeholders(graph: fx.Graph) -> int:
    """Placeholders that come after some non-placeholder node (0 when consolidated)."""
    seen_body = False
    count = 0
    for node in graph.nodes:
        if node.op != "placeholder":
            seen_body = True
        elif seen_body:
            count += 1
    return count


def size_key(graph: fx.Graph) -> tuple[int, int, int, int]:
    """What minimization decreases, lexicographically: ops, outputs, inputs, misplaced inputs."""
    return (count_ops(graph), len(outputs(graph)), len(placeholders(graph)),
            misplaced_placeholders(graph))


def is_promotable(node: fx.Node) -> bool:
    """Whether `node` can become an input (its concrete value is in the value store)."""
    return (node.op == "call_function" and META_VALUE in node.meta
            and node.meta.get(META_KIND) in PROMOTABLE_KINDS)


# ---------------------------------------------------------------------------------------------
# Rendering


def copy_graph(graph: fx.Graph) -> fx.Graph:
    """A fresh graph with the same nodes, names and (shallow-copied) meta."""
    return _rebuild(graph, lambda node: True)


def to_graph_module(graph: fx.Graph) -> fx.GraphModule:
    """A runnable GraphModule over a copy of `graph`, its subgraphs installed as submodules."""
    root = torch.nn.Module()
    for node in subgraphs(graph):
        root.add_module(str(node.target), to_graph_module(subgraph_of(node)))
    return fx.GraphModule(root, copy_graph(graph))


def graph_code(graph: fx.Graph) -> str:
    """Readable Python for `graph`, as FX's `gm.code`, then each subgraph's (`# name:` above it)."""
    parts = [to_graph_module(graph).code.strip()]
    for node in subgraphs(graph):
        parts.append(f"# {node.target}:\n" + graph_code(subgraph_of(node)))
    return "\n\n".join(parts)


# ---------------------------------------------------------------------------------------------
# Surgery (pure: copy in, copy out)


def _rebuild(graph: fx.Graph, keep: Callable[[fx.Node], bool],
             replace: dict[str, Callable[[fx.Graph, fx.Node], fx.Node]] | None = None,
             order: Iterable[fx.Node] | None = None) -> fx.Graph:
    """Copy the nodes `keep` accepts, in `order`; `replace[name]` builds a node's stand-in."""
    new_graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    replace = replace or {}
    for node in order if order is not None else graph.nodes:
        if not keep(node):
            continue
        if node.name in replace:
            new_node = replace[node.name](new_graph, node)
        else:
            new_node = new_graph.node_copy(node, lambda n: env[n])
            new_node.meta = dict(node.meta)
        env[node] = new_node
    return new_graph


def _with_output(graph: fx.Graph, values: Sequence[Any]) -> fx.Graph:
    new_graph = copy_graph(graph)
    old_output = output_node(new_graph)
    by_name = {node.name: node for node in new_graph.nodes}

    def remap(value: Any) -> Any:
        return by_name[value.name] if isinstance(value, fx.Node) else value

    with new_graph.inserting_before(old_output):
        new_output = new_graph.output(tuple(remap(value) for value in values))
    new_output.meta = dict(old_output.meta)
    new_graph.erase_node(old_output)
    return new_graph


def _node(graph: fx.Graph, name: str) -> fx.Node:
    for node in graph.nodes:
        if node.name == name:
            return node
    raise KeyError(f"no node named {name!r}")


def is_mutating(node: fx.Node) -> bool:
    """Whether `node` calls an op that writes into an argument (`mul_`, a buffer's `add_`)."""
    schema = getattr(node.target, "_schema", None)
    return schema is not None and schema.is_mutable


def _live_nodes(graph: fx.Graph) -> set[fx.Node]:
    """Nodes the outputs (or an argument-mutating op) need, placeholders included."""
    live: set[fx.Node] = set()
    stack = [node for node in graph.nodes if node.op == "output" or is_mutating(node)]
    while stack:
        node = stack.pop()
        if node not in live:
            live.add(node)
            stack.extend(node.all_input_nodes)
    return live


def eliminate_dead_code(graph: fx.Graph) -> fx.Graph:
    """Drop call_function nodes whose value nobody uses.

    Unlike `fx.Graph.eliminate_dead_code`, side-effect-only nodes (asserts, profiler marks) go
    too: a minimized program needs none of them. Ops that mutate an argument stay.
    """
    live = _live_nodes(graph)
    return _rebuild(graph, lambda node: node.op not in _BODY_OPS or node in live)


def remove_unused_inputs(graph: fx.Graph) -> fx.Graph:
    """Drop placeholders nothing reads."""
    return _rebuild(graph, lambda node: node.op != "placeholder" or bool(node.users))


def consolidate_inputs(graph: fx.Graph) -> fx.Graph:
    """Move every placeholder to the front, keeping their relative order."""
    return _rebuild(graph, lambda node: True, order=_inputs_first(graph.nodes))


def _inputs_first(nodes: Iterable[fx.Node]) -> list[fx.Node]:
    nodes = list(nodes)
    return [n for n in nodes if n.op == "placeholder"] + [n for n in nodes if n.op != "placeholder"]


def canonicalize(graph: fx.Graph) -> fx.Graph:
    """Dead code out, unused inputs out, inputs first (in one copy): every candidate's form."""
    return derive(graph)


def derive(graph: fx.Graph, *, cut: str | None = None, keep_outputs: Sequence[int] | None = None,
           promote: Iterable[str] = (), bypass: Mapping[str, str] | None = None,
           output_names: Sequence[str] | None = None, also_output: Sequence[str] = ()) -> fx.Graph:
    """A canonical candidate in one copy: the fused form of the primitives below.

    `cut`: output only that node, dropping everything after it (`truncate_after`).
    `keep_outputs`: keep only these output positions (`prune_outputs`).
    `output_names`: output exactly these nodes instead (`extract`).
    `also_output`: append these nodes to the outputs (`cut_chain`: keeps them alive).
    `promote`: these nodes become placeholders (names from `promotion_targets`).
    `bypass`: {node: stand-in}: users of the node read the stand-in instead (`drop_node`).
    The result is canonical (`canonicalize`): live nodes only, placeholders first, in order.
    """
    nodes = list(graph.nodes)
    by_name = {node.name: node for node in nodes}
    stand_ins = {by_name[name]: by_name[other] for name, other in (bypass or {}).items()}
    promoted = {by_name[name] for name in promote}

    def resolve(node: fx.Node) -> fx.Node:
        while node in stand_ins:
            node = stand_ins[node]
        return node

    if cut is not None:
        last = nodes.index(by_name[cut])
        values: list[Any] = [by_name[cut]]
    else:
        last = len(nodes) - 1
        values = outputs(graph)
        if keep_outputs is not None:
            values = [values[index] for index in keep_outputs]
        if output_names is not None:
            values = [by_name[name] for name in output_names]
    values += [by_name[name] for name in also_output]
    values = [resolve(value) if isinstance(value, fx.Node) else value for value in values]
    stack = [value for value in values if isinstance(value, fx.Node)]
    stack += [node for node in nodes[: last + 1] if is_mutating(node) and node not in stand_ins]
    live: set[fx.Node] = set()
    while stack:
        node = stack.pop()
        if node not in live:
            live.add(node)
            if node not in promoted:
                stack.extend(resolve(arg) for arg in node.all_input_nodes)

    inputs = [n for n in nodes if n in live and (n.op == "placeholder" or n in promoted)]
    body = [n for n in nodes if n in live and n.op in _BODY_OPS and n not in promoted]
    new_graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in inputs + body:
        if node in promoted:
            env[node] = _promoted_placeholder(new_graph, node)
        else:
            env[node] = new_graph.node_copy(node, lambda arg: env[resolve(arg)])
            env[node].meta = dict(node.meta)
    new_output = new_graph.output(tuple(env[v] if isinstance(v, fx.Node) else v for v in values))
    new_output.meta = dict(output_node(graph).meta)
    return new_graph


def _promoted_placeholder(new_graph: fx.Graph, node: fx.Node) -> fx.Node:
    new_node = new_graph.create_node("placeholder", node.name, name=node.name)
    new_node.meta = {key: node.meta[key] for key in _META_KEYS if key in node.meta}
    new_node.meta[META_ROLE] = "promoted"
    return new_node


def truncate_after(graph: fx.Graph, node_name: str) -> fx.Graph:
    """Keep the nodes up to `node_name`; the output is that single node. Then DCE."""
    nodes = list(graph.nodes)
    cut = next((i for i, node in enumerate(nodes) if node.name == node_name), None)
    if cut is None:
        raise KeyError(f"no node named {node_name!r}")
    if nodes[cut].op != "call_function":
        raise ValueError(f"cannot truncate after {nodes[cut].op} {node_name!r}")
    kept = set(nodes[: cut + 1])
    new_graph = _rebuild(graph, lambda node: node in kept)
    new_graph.output((_node(new_graph, node_name),)).meta = {META_KIND: "other"}
    return eliminate_dead_code(new_graph)


def promotion_targets(graph: fx.Graph, node_names: Iterable[str]) -> list[str]:
    """The nodes that promoting `node_names` really promotes, in graph order.

    A promotable node stands for itself; a tuple-valued node (e.g. `aten.max.dim`) stands for
    its promotable `getitem` users, as torch's delta debugging does; anything else for nothing.
    """
    wanted: set[str] = set()
    by_name = {node.name: node for node in graph.nodes}
    for name in node_names:
        node = by_name[name]
        if is_promotable(node):
            wanted.add(name)
        elif node.op == "call_function" and node.meta.get(META_KIND) == "tuple":
            wanted.update(user.name for user in node.users if is_promotable(user))
    return [node.name for node in graph.nodes if node.name in wanted]


def promote_to_inputs(graph: fx.Graph, node_names: Iterable[str]) -> fx.Graph:
    """Turn nodes into placeholders of the same name (see `promotion_targets`).

    The placeholders stay where the nodes were (`consolidate_inputs` moves them); their
    `minify_value` and tensor meta are kept, their role is "promoted". Nothing is DCE'd.
    """
    targets = promotion_targets(graph, node_names)
    if not targets:
        raise ValueError(f"none of {list(node_names)!r} can be promoted to an input")

    return _rebuild(graph, lambda node: True, replace=dict.fromkeys(targets, _promoted_placeholder))


def remove_outputs(graph: fx.Graph, indices: Iterable[int]) -> fx.Graph:
    """Drop the outputs at `indices` (positions in the flat output tuple). No DCE."""
    dropped = set(indices)
    return _with_output(graph, [v for i, v in enumerate(outputs(graph)) if i not in dropped])


def prune_outputs(graph: fx.Graph, keep: Iterable[int]) -> fx.Graph:
    """Keep only the outputs at `keep`, in their order, then DCE and drop unused inputs."""
    values = outputs(graph)
    return remove_unused_inputs(eliminate_dead_code(_with_output(graph, [values[i] for i in keep])))


def drop_node(graph: fx.Graph, node_name: str) -> fx.Graph | None:
    """Remove an op: its users read `stand_in_for(node)` instead. None when there is none.

    The result is DCE'd (not otherwise canonicalized).
    """
    stand_in = stand_in_for(graph, node_name)
    if stand_in is None:
        return None
    new_graph = copy_graph(graph)
    new_node = _node(new_graph, node_name)
    new_node.replace_all_uses_with(_node(new_graph, stand_in))
    new_graph.erase_node(new_node)
    return eliminate_dead_code(new_graph)


def stand_in_for(graph: fx.Graph, node_name: str) -> str | None:
    """An input of the op with the same shape, stride, dtype and device, that could replace it
    (a different stride could break a later `view`); None when there is none."""
    node = _node(graph, node_name)
    meta = node.meta.get(META_TENSOR)
    if node.op != "call_function" or node.meta.get(META_KIND) != "tensor" or meta is None:
        return None
    return next((arg.name for arg in node.all_input_nodes
                 if arg.meta.get(META_KIND) == "tensor" and _same_type(arg.meta.get(META_TENSOR), meta)),
                None)


def _same_type(left: dict[str, Any] | None, right: dict[str, Any]) -> bool:
    return left is not None and all(left.get(key) == right.get(key)
                                    for key in ("shape", "stride", "dtype", "device"))


def is_output_value(node: fx.Node) -> bool:
    """Whether `node` can be an output of a candidate: an op producing one tensor or scalar."""
    return node.op == "call_function" and node.meta.get(META_KIND) in PROMOTABLE_KINDS


def extract(graph: fx.Graph, node_names: Iterable[str]) -> fx.Graph | None:
    """The ops `node_names` alone, as a canonical candidate; None when it would output nothing.

    What they read from outside becomes an input (promoted); an outside op that cannot be promoted
    (a tuple-valued op such as `aten.max.dim` under a kept `getitem`) comes along instead. The
    outputs are the kept ops whose value left the kept set: read by an op outside it, returned by
    the graph, or read by nobody.
    """
    nodes = list(graph.nodes)
    by_name = {node.name: node for node in nodes}
    kept = {by_name[name] for name in node_names}
    stack = list(kept)
    while stack:
        node = stack.pop()
        for arg in node.all_input_nodes:
            if arg.op == "call_function" and arg not in kept and not is_promotable(arg):
                kept.add(arg)
                stack.append(arg)
    promoted = {arg.name for node in kept for arg in node.all_input_nodes
                if arg.op == "call_function" and arg not in kept}
    boundary = [node.name for node in nodes if node in kept and is_output_value(node)
                and (not node.users or any(user not in kept for user in node.users))]
    if not boundary:
        return None
    return derive(graph, promote=promoted, output_names=boundary)


def cut_chain(graph: fx.Graph, node_name: str) -> fx.Graph | None:
    """Promote `node_name` to an input and keep its producers alive as extra outputs.

    Plain promotion loses the ops upstream of the node when nothing else reads them (DCE drops
    them); this keeps both ends of a chain, so `a -> b -> c` can become `a` and `c` apart. None
    when no producer would die (plain promotion is then the same candidate) or nothing promotes.
    """
    targets = promotion_targets(graph, [node_name])
    if not targets:
        return None
    promoted = derive(graph, promote=targets)
    surviving = {node.name for node in promoted.nodes}
    by_name = {node.name: node for node in graph.nodes}
    producers = {arg.name for name in targets for arg in by_name[name].all_input_nodes
                 if is_output_value(arg) and arg.name not in surviving}
    if not producers:
        return None
    ordered = [node.name for node in graph.nodes if node.name in producers]
    return derive(graph, promote=targets, also_output=ordered)


# ---------------------------------------------------------------------------------------------
# Higher-order ops: inlining a subgraph, editing one


def inlinable_subgraphs(graph: fx.Graph, node_name: str) -> list[str]:
    """The subgraphs (get_attr names) that `inline_subgraph` can put in place of a higher-order op.

    cond: the branch the original run took first (`minify_taken`), then the other; while_loop:
    its body (one iteration); invoke_subgraph: its subgraph. Others (map, scan, flex attention)
    call their subgraphs on slices or scalars: none.
    """
    node = _node(graph, node_name)
    if node.op != "call_function" or not isinstance(node.target, torch._ops.HigherOrderOperator):
        return []
    positions = {
        "higher_order.cond": [1, 2] if node.meta.get(META_TAKEN) != 2 else [2, 1],
        "higher_order.while_loop": [1],
        "higher_order.invoke_subgraph": [0],
    }.get(target_name(node.target), [])
    return [node.args[position].name for position in positions
            if position < len(node.args) and isinstance(node.args[position], fx.Node)
            and node.args[position].op == "get_attr"]


def _subgraph_operands(node: fx.Node) -> list[Any]:
    """What a subgraph's placeholders read, in order, for the ops `inlinable_subgraphs` knows."""
    name = target_name(node.target)
    if name == "higher_order.cond":
        return list(node.args[3])
    if name == "higher_order.while_loop":
        return list(node.args[2]) + list(node.args[3])
    return list(node.args[2:])  # invoke_subgraph(subgraph, identifier, *operands)


def inline_subgraph(graph: fx.Graph, node_name: str, subgraph_name: str) -> fx.Graph | None:
    """The higher-order op `node_name` replaced by the body of its subgraph `subgraph_name`, called
    once on the op's operands (see `inlinable_subgraphs`), as a canonical candidate.

    The op's `getitem` users read the subgraph's outputs instead. Inlined nodes keep their meta
    (a taken cond branch's ops have values, so they can be promoted); names are made unique. None
    when the op's result is used other than through `getitem` or the arity does not fit.
    """
    by_name = {node.name: node for node in graph.nodes}
    hop = by_name[node_name]
    subgraph = subgraph_of(by_name[subgraph_name])
    operands = _subgraph_operands(hop)
    parameters = placeholders(subgraph)
    results = outputs(subgraph)
    users = list(hop.users)
    if len(operands) != len(parameters) or not all(
            user.target is operator.getitem and isinstance(user.args[1], int)
            and 0 <= user.args[1] < len(results) for user in users):
        return None
    new_graph = fx.Graph()
    env: dict[fx.Node, Any] = {}
    inner: dict[fx.Node, Any] = {}
    for node in graph.nodes:
        if node in users:
            continue
        if node is not hop:
            env[node] = new_graph.node_copy(node, lambda n: env[n])
            env[node].meta = dict(node.meta)
            continue
        inner.update((parameter, env[operand] if isinstance(operand, fx.Node) else operand)
                     for parameter, operand in zip(parameters, operands, strict=True))
        for sub_node in subgraph.nodes:
            if sub_node.op in _BODY_OPS:
                inner[sub_node] = new_graph.node_copy(sub_node, lambda n: inner[n])
                inner[sub_node].meta = dict(sub_node.meta)
                if sub_node.op == "get_attr":
                    inner[sub_node].target = inner[sub_node].name
        for user in users:
            result = results[user.args[1]]
            env[user] = inner[result] if isinstance(result, fx.Node) else result
    return derive(new_graph)


def with_subgraph(graph: fx.Graph, subgraph_name: str, subgraph: fx.Graph) -> fx.Graph:
    """A copy of `graph` whose get_attr node `subgraph_name` stands for `subgraph` instead."""
    new_graph = copy_graph(graph)
    _node(new_graph, subgraph_name).meta[META_SUBGRAPH] = subgraph
    return new_graph


def drop_in_subgraph(subgraph: fx.Graph, node_name: str) -> fx.Graph | None:
    """`subgraph` without the op `node_name` (its users read a same-typed input, `stand_in_for`),
    dead code removed, its placeholders and output arity kept (the op calling it needs them).
    None when the op has no stand-in. The same surgery as `drop_node`: dead-code removal keeps
    placeholders and the output node, so the arity holds."""
    return drop_node(subgraph, node_name)
