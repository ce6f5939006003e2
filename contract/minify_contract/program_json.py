"""program.json: minify's own program format, for a program `torch.export.save` cannot write.

torch.export keeps programs its serializer refuses on torch 2.13 (a `while_loop` that carries a
Python int, pytorch#166525: "SerializeError: Unsupported list/tuple argument type"); the capture
then writes the program as minify's wire form (`minify_contract.fx.wire`, the form sandbox children
exchange candidates in) instead of a `.pt2`:

    {"format": "minify-fx-program/1",
     "graph": {"version": 1, "nodes": [{"name", "op", "target", "args", "kwargs", "meta"}, ...]},
     "torch_version": "2.13.0+cpu",
     "why": "torch.export.save cannot write it (SerializeError: ...)"}

Its values travel beside it in an inputs file (`inputs.pt`, read with `torch.load(weights_only=True)`):
a dict of every placeholder's value by its name (parameters and buffers included), or a tuple of
them in the placeholders' order (as a job's inputs.pt beside its minimized.json is). JSON is data:
nothing in the file is unpickled or run, and a call target is resolved from the worker's allowlist
(`minify_contract.fx.targets`) or refused.

`check_document` is the check the server runs on an upload and the worker runs again before it
loads one, without torch: the structure, the node references, the target names. What it cannot
check without torch (that a target exists, that values fit) the worker's loader reports.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

FORMAT = "minify-fx-program/1"
WIRE_VERSION = 1
# Deeper nesting of subgraphs (a cond in a while_loop in a cond ...) than any real program has.
MAX_SUBGRAPH_DEPTH = 32

_OPS = ("placeholder", "call_function", "get_attr", "output")
_TAGS = frozenset({"node", "float", "complex", "list", "tuple", "dict", "dtype", "device", "layout",
                   "memory_format", "slice", "ellipsis"})
_TARGET = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){1,2}$")
# The Python functions a call target may name besides torch's op overloads and higher-order ops
# (`namespace.op[.overload]`): the worker's allowlist (`minify_contract.fx.targets`) reads these.
PYTHON_MODULES = ("operator", "math")
BUILTIN_NAMES = ("abs", "min", "max", "round", "int", "float", "bool", "len", "pow", "divmod", "sum", "any", "all")
TORCH_SYM_NAMES = ("sym_float", "sym_int", "sym_max", "sym_min", "sym_not", "sym_ite", "sym_sum", "_sym_sqrt")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ProgramJsonError(ValueError):
    """The file is not a program.json minify reads; the message says where and why."""


def document(wire_graph: dict[str, Any], *, torch_version: str, why: str) -> dict[str, Any]:
    """program.json's content for `wire_graph` (`graph_to_wire`'s form); `why` says why it is not a .pt2."""
    return {"format": FORMAT, "graph": wire_graph, "torch_version": torch_version, "why": why}


def read_document(data: bytes) -> dict[str, Any]:
    """The program.json in `data`, checked (`check_document`); raises `ProgramJsonError`."""
    try:
        parsed = json.loads(data)
    except UnicodeDecodeError as error:
        raise ProgramJsonError(f"not a program.json: not UTF-8 text ({error.reason})") from None
    except RecursionError:
        raise ProgramJsonError("not a program.json: nested too deeply") from None
    except ValueError as error:
        raise ProgramJsonError(f"not a program.json: not JSON ({error})") from None
    check_document(parsed)
    return parsed


def check_document(parsed: Any) -> None:
    """Raise `ProgramJsonError` when `parsed` (JSON-decoded) is not a program.json minify reads."""
    if not isinstance(parsed, dict):
        raise ProgramJsonError(f"not a program.json: the top level is a {type(parsed).__name__}, not an object")
    if parsed.get("format") != FORMAT:
        raise ProgramJsonError(f"not a program.json: its format is {parsed.get('format')!r}, not {FORMAT!r}")
    try:
        _check_graph(parsed.get("graph"), "graph", 0)
    except RecursionError:
        raise ProgramJsonError("not a program.json: nested too deeply") from None


def _check_graph(graph: Any, where: str, depth: int) -> None:
    if depth > MAX_SUBGRAPH_DEPTH:
        raise ProgramJsonError(f"{where}: subgraphs nested more than {MAX_SUBGRAPH_DEPTH} deep")
    if not isinstance(graph, dict):
        raise ProgramJsonError(f"{where}: not an object")
    if graph.get("version") != WIRE_VERSION:
        raise ProgramJsonError(f"{where}: wire version {graph.get('version')!r}; this minify reads {WIRE_VERSION}")
    nodes = graph.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise ProgramJsonError(f"{where}: 'nodes' must be a non-empty list")
    seen: set[str] = set()
    for position, node in enumerate(nodes):
        name = _check_node(node, f"{where}.nodes[{position}]", seen, depth)
        seen.add(name)
    outputs = [position for position, node in enumerate(nodes) if node["op"] == "output"]
    if outputs != [len(nodes) - 1]:
        raise ProgramJsonError(f"{where}: needs exactly one output node, the last")


def _check_target(target: Any, where: str) -> None:
    """A call target is an op's name (`aten.relu.default`, `higher_order.cond`, a custom op's
    `namespace.op`), `operator.X`/`math.X`, one of a few builtins or `torch.sym_*`; a Python
    module's function by any other name (`os.system`) is refused here, before it costs a job."""
    if not (isinstance(target, str) and _TARGET.match(target)):
        raise ProgramJsonError(f"{where}: target {target!r} is not an operator name (as 'aten.relu.default')")
    module, *rest = target.split(".")
    allowed = {"builtins": BUILTIN_NAMES, "torch": TORCH_SYM_NAMES}.get(module)
    if allowed is not None and (len(rest) != 1 or rest[0] not in allowed):
        raise ProgramJsonError(f"{where}: target {target!r} is not one a program may call ({module}: "
                               f"{', '.join(allowed)})")
    if module in PYTHON_MODULES and (len(rest) != 1 or rest[0].startswith("_")):
        raise ProgramJsonError(f"{where}: target {target!r} is not a public function of {module}")
    if allowed is None and module not in PYTHON_MODULES and module in sys.stdlib_module_names:
        raise ProgramJsonError(f"{where}: target {target!r} names a function of Python's {module} module; a "
                               f"program calls torch's ops and only {', '.join(PYTHON_MODULES)}, a few builtins "
                               "and torch.sym_* besides")


def _check_node(node: Any, where: str, seen: set[str], depth: int) -> str:
    if not isinstance(node, dict):
        raise ProgramJsonError(f"{where}: not an object")
    name, op = node.get("name"), node.get("op")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ProgramJsonError(f"{where}: name {name!r} is not an identifier")
    where = f"{where} ({name})"
    if name in seen:
        raise ProgramJsonError(f"{where}: a second node of that name")
    if op not in _OPS:
        raise ProgramJsonError(f"{where}: op {op!r} is not one of {', '.join(_OPS)}")
    target = node.get("target")
    if op == "call_function":
        _check_target(target, where)
    if op == "placeholder" and not isinstance(target, str):
        raise ProgramJsonError(f"{where}: a placeholder's target must be a string")
    if op == "get_attr":
        if target != name:
            raise ProgramJsonError(f"{where}: a get_attr node stands for its subgraph: its target must be its name")
        _check_graph(node.get("subgraph"), f"{where}.subgraph", depth + 1)
    args, kwargs = node.get("args", []), node.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise ProgramJsonError(f"{where}: 'args' must be a list and 'kwargs' an object")
    for value in [*args, *kwargs.values()]:
        _check_value(value, where, seen)
    meta = node.get("meta", {})
    if not isinstance(meta, dict) or not all(isinstance(key, str) and key.startswith("minify_") for key in meta):
        raise ProgramJsonError(f"{where}: 'meta' must be an object of minify_* keys")
    return name


def _check_value(value: Any, where: str, seen: set[str]) -> None:
    if value is None or isinstance(value, (bool, int, str)):
        return
    if not isinstance(value, dict) or len(value) != 1:
        raise ProgramJsonError(f"{where}: malformed argument {_clip(value)}")
    ((tag, payload),) = value.items()
    if tag not in _TAGS:
        raise ProgramJsonError(f"{where}: unknown argument tag {tag!r}")
    if tag == "node" and payload not in seen:
        raise ProgramJsonError(f"{where}: refers to {payload!r}, not a node before it")
    if tag in ("list", "tuple", "complex", "slice"):
        if not isinstance(payload, list):
            raise ProgramJsonError(f"{where}: {tag} {_clip(payload)} is not a list")
        for item in payload:
            _check_value(item, where, seen)
    if tag == "dict":
        if not isinstance(payload, list) or not all(isinstance(pair, list) and len(pair) == 2 for pair in payload):
            raise ProgramJsonError(f"{where}: dict {_clip(payload)} is not a list of pairs")
        for pair in payload:
            for item in pair:
                _check_value(item, where, seen)


def _clip(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:79] + "…"
