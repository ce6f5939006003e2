"""A StableHLO program as the engine holds it: the main function's ops as text, pure Python.

The engine's process never parses a user's module (only sandbox children do, `parse.py`): a child
reads the module once and hands back this form, and everything after that (candidates, their
memo keys, sizes, op kinds, the module text a child compiles) is string work over it.

- Every top-level value of `main` has a key: `a<N>` for its arguments, `v<N>` for the result of
  its N-th op (`v<N>#<K>` for the K-th of several). In an op's text a value is written
  `%m.<key>`, names MLIR's printer never makes, so renaming never touches a name inside a region.
- An op is one op of `main`'s block, regions and all (a `while`, a `case`, a `reduce` stay whole):
  its text after `=`, the keys it reads (its operands, and what its regions capture), its results.
- A candidate keeps a subset of the original's ops, in their order: whatever a kept op reads that
  no kept op computes is an argument, an original one or a promoted intermediate (its value was
  recorded from the original run: `recorded`). Other top-level ops (the private functions the
  ops call) go along only where a kept op names them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

# A reference to a top-level value in an op's text, or a string literal (skipped: never renamed).
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|%m\.(?P<key>[av]\d+(?:#\d+)?)')
_SYMBOL = re.compile(r'"(?:[^"\\]|\\.)*"|@(?P<name>[A-Za-z_$.\-][\w$.\-]*)')
_FLOAT_ELEMENT = re.compile(r"[<x](?:bf16|f16|f32|f64|f8\w*|complex<[^>]*>)>")
_SHAPE = re.compile(r"^tensor<(?P<dims>(?:[0-9?]+x)*)(?P<element>[^,>]+(?:<[^>]*>)?)(?:,[^>]*)?>$")


def ssa(key: str) -> str:
    """The SSA name a value is written as where it is an argument (no `#`: one value each)."""
    return "%m." + key.replace("#", "_")


def reference(key: str) -> str:
    """How an op's text reads the value `key` when an op computes it (`%m.v3#1`)."""
    return "%m." + key


def references(text: str) -> list[str]:
    """The keys of the top-level values `text` reads, in order of first use."""
    keys = [match["key"] for match in _TOKEN.finditer(text) if match["key"]]
    return list(dict.fromkeys(keys))


def symbols(text: str) -> list[str]:
    """The symbols (`@name`) `text` names, outside string literals."""
    return list(dict.fromkeys(match["name"] for match in _SYMBOL.finditer(text) if match["name"]))


def is_float_type(type_text: str) -> bool:
    return _FLOAT_ELEMENT.search(type_text) is not None


def tensor_shape(type_text: str) -> tuple[list[int], str] | None:
    """`tensor<4x8xf32>` -> ([4, 8], "f32"); None for anything else (a token, a tuple, a dynamic dim)."""
    match = _SHAPE.match(type_text.strip())
    if match is None or "?" in match["dims"]:
        return None
    dims = [int(dim) for dim in match["dims"].split("x") if dim]
    return dims, match["element"]


@dataclass(frozen=True)
class Value:
    """One top-level value: its key and MLIR type (`tensor<4x8xf32>`)."""

    key: str
    type: str


@dataclass(frozen=True)
class Op:
    """One op of main, regions included; `index` is its position in the original program."""

    index: int
    kind: str
    results: tuple[Value, ...]
    operands: tuple[str, ...]
    body: str
    nested: int = 0

    @property
    def result_keys(self) -> tuple[str, ...]:
        return tuple(value.key for value in self.results)

    def text(self, renamed: Mapping[str, str]) -> str:
        """The op as a line of main, its reads of `renamed` keys pointed at their arguments."""
        body = self.body
        if renamed:
            body = _TOKEN.sub(lambda m: renamed.get(m["key"], m[0]) if m["key"] else m[0], body)
        if not self.results:
            return body
        name = reference(f"v{self.index}")
        return f"{name}{f':{len(self.results)}' if len(self.results) > 1 else ''} = {body}"


@dataclass(frozen=True)
class Global:
    """A top-level op other than main (a private function, a mesh): its text, kept where named."""

    name: str
    text: str
    names: tuple[str, ...] = ()


@dataclass(frozen=True)
class Module:
    """A program or a candidate. `types` and `recorded` describe every value of the original
    (shared by all candidates): a value is promotable when its value was recorded."""

    name: str
    attributes: str
    globals: tuple[Global, ...]
    args: tuple[Value, ...]
    ops: tuple[Op, ...]
    outputs: tuple[str, ...]
    types: Mapping[str, str] = field(hash=False, compare=False, repr=False, default_factory=dict)
    recorded: frozenset[str] = field(hash=False, compare=False, repr=False, default=frozenset())

    def op_keys(self) -> set[str]:
        return {key for op in self.ops for key in op.result_keys}


# ---------------------------------------------------------------------------------------------
# Rendering


def render(module: Module) -> str:
    """The module's MLIR text: a `main` over its args and ops, and the globals its ops name."""
    computed = module.op_keys()
    renamed = {value.key: ssa(value.key) for value in module.args if "#" in value.key}
    lines = [f"module @{module.name}" + (f" attributes {module.attributes}" if module.attributes else "") + " {"]
    for item in needed_globals(module):
        lines.append(_indent(item.text, 2))
    params = ", ".join(f"{ssa(value.key)}: {value.type}" for value in module.args)
    types = [module.types.get(key, "") for key in module.outputs]
    lines.append(f"  func.func public @main({params}) -> ({', '.join(types)}) {{")
    for op in module.ops:
        lines.append(_indent(op.text(renamed), 4))
    returned = [reference(key) if key in computed else ssa(key) for key in module.outputs]
    lines.append(f"    return {', '.join(returned)} : {', '.join(types)}" if returned else "    return")
    lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def display(module: Module) -> str:
    """The module's text for a reader (progress events, report.json, the dashboard): its values
    named `%a0` (arguments) and `%v6` (the original's op 6), which no printed name inside a region
    can be; minimized.mlir is MLIR's own printing."""
    return _TOKEN.sub(lambda match: "%" + match["key"] if match["key"] else match[0], render(module))


def needed_globals(module: Module) -> list[Global]:
    """The globals the ops name, and those they name in turn; a global without a symbol (none
    can name it) always."""
    by_name = {item.name: item for item in module.globals if item.name}
    wanted: set[str] = set()
    pending = [name for op in module.ops for name in symbols(op.body)]
    while pending:
        name = pending.pop()
        if name in by_name and name not in wanted:
            wanted.add(name)
            pending.extend(by_name[name].names)
    return [item for item in module.globals if not item.name or item.name in wanted]


def _indent(text: str, spaces: int) -> str:
    pad = " " * spaces
    return "\n".join(pad + line if line.strip() else line for line in text.splitlines())


def key(module: Module) -> str:
    """The memo key: equal candidates render equal, wherever they come from."""
    return hashlib.sha256(render(module).encode()).hexdigest()


def size(module: Module) -> tuple[int, int, int, int]:
    """What minimization decreases, lexicographically: ops, ops inside regions, outputs, args."""
    return (len(module.ops), sum(op.nested for op in module.ops), len(module.outputs), len(module.args))


_SIZES = re.compile(r"tensor<(?:[0-9?]+x)+")


def shape_hash(module: Module) -> str:
    """What a bug is made of, not one instance of it: the module's text with its values numbered in
    order of appearance (not by their place in the original) and without tensor sizes, hashed."""
    numbers: dict[str, str] = {}

    def renumber(match: re.Match[str]) -> str:
        if not match["key"]:
            return match[0]
        value, hash_sign, result = match["key"].partition("#")
        return numbers.setdefault(value, f"%m.{len(numbers)}") + hash_sign + result

    text = _TOKEN.sub(renumber, render(module))
    return hashlib.sha256(_SIZES.sub("tensor<", text).encode()).hexdigest()


def input_shapes(module: Module) -> dict[str, dict[str, Any]]:
    """`{key: {"shape": [...], "dtype": "f32"}}` of the module's tensor arguments (report.json)."""
    shapes = {}
    for value in module.args:
        parsed = tensor_shape(value.type)
        if parsed is not None:
            shapes[value.key] = {"shape": parsed[0], "dtype": parsed[1]}
    return shapes


def op_kinds(module: Module) -> frozenset[str]:
    return frozenset(op.kind for op in module.ops)


def empty(module: Module) -> Module:
    """No ops: main returns its arguments."""
    return replace(module, ops=(), outputs=tuple(value.key for value in module.args))


# ---------------------------------------------------------------------------------------------
# Wire form


def to_wire(module: Module) -> dict[str, Any]:
    return {
        "name": module.name,
        "attributes": module.attributes,
        "globals": [[item.name, item.text, list(item.names)] for item in module.globals],
        "args": [[value.key, value.type] for value in module.args],
        "ops": [{"index": op.index, "kind": op.kind, "results": [[v.key, v.type] for v in op.results],
                 "operands": list(op.operands), "body": op.body, "nested": op.nested} for op in module.ops],
        "outputs": list(module.outputs),
        "types": dict(module.types),
        "recorded": sorted(module.recorded),
    }


def from_wire(wire: Mapping[str, Any]) -> Module:
    return Module(
        name=wire["name"],
        attributes=wire["attributes"],
        globals=tuple(Global(name, text, tuple(names)) for name, text, names in wire["globals"]),
        args=tuple(Value(k, t) for k, t in wire["args"]),
        ops=tuple(Op(op["index"], op["kind"], tuple(Value(k, t) for k, t in op["results"]), tuple(op["operands"]),
                     op["body"], op.get("nested", 0)) for op in wire["ops"]),
        outputs=tuple(wire["outputs"]),
        types=dict(wire["types"]),
        recorded=frozenset(wire["recorded"]),
    )


def catalog(args: Sequence[Value], ops: Iterable[Op]) -> dict[str, str]:
    """Every value's type by key."""
    types = {value.key: value.type for value in args}
    for op in ops:
        types.update((value.key, value.type) for value in op.results)
    return types
