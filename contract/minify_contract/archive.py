"""Which members of a .pt2 would run code when `torch.export.load` reads it? Pure Python, no torch.

`torch.export.load` is not a safe reader (torch's docs say: never load data from an untrusted
source). Read from torch 2.13's `torch/export/pt2_archive/_package.py`, `torch/export/__init__.py`
and `torch/_export/serde/serialize.py`, these parts of an archive run code while loading:

- a weight marked `"use_pickle": true` in `data/weights/<model>_weights_config.json`, and a
  `tensor_*` constant marked so in `data/constants/<model>_constants_config.json`:
  `torch.load(weights_only=False)`;
- a `custom_obj_*` constant (TorchScript's pickler) and an `opaque_obj_*` constant (`pickle.loads`);
- `data/weights/<model>.pt`, `data/constants/<model>.pt` (legacy layout), `data/sample_inputs/*.pt`
  and the pre-2.7 flat `serialized_*` files: `torch.load(weights_only=True)`, and on any error again
  with `weights_only=False`. They are safe only when every global their pickle names is one the
  weights-only unpickler allows (tensors, storages, dtypes), so that is what is checked here;
- a SymInt/SymFloat/SymBool `expr_str` in `models/<model>.json`: `sympy.sympify`, which is `eval`;
- a module named in an input or output structure (the treespecs in `models/<model>.json`):
  `torch.utils._pytree` imports the module of an enum in a node's context (`enum_object_hook`)
  and of a `defaultdict`'s default factory, so an upload could import any module installed on
  the worker (its import-time code runs); only torch's own enums and builtin factories pass;
- anything under `data/aotinductor/`: a compiled shared library that the loader opens.

`torch.export.save` writes none of these for ordinary tensors, so an archive it wrote passes; a
constant or weight torch cannot store flat (a tensor subclass, a custom object) is a pickle, and
is refused unless the operator trusts uploads. Anything this module cannot check counts as unsafe.

`describe_not_a_zip` says what an upload that is no zip at all is instead (empty, a pickle, a
program in another format), in the same words for the server's check and the worker's.
"""

from __future__ import annotations

import ast
import builtins
import json
import pickletools
import posixpath
import re
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

ALLOW_PICKLE_ENV = "MINIFY_ALLOW_PICKLE"

# What a file's first bytes say it is, for one that is not a zip (`describe_not_a_zip`).
MLIR_BYTECODE_MAGIC = b"ML\xefR"
_PICKLE_PROTOCOLS = tuple(bytes([protocol]) for protocol in range(2, 6))
_ZIP_MEMBER_MAGIC = b"PK\x03\x04"  # a zip's first member; its directory is at the end
_HEAD_BYTES = 4096

# A pickle to scan that is larger than this is not checked but refused (a torch.save pickle holds
# only the structure; tensor bytes live in separate records).
PICKLE_SCAN_LIMIT = 16 * 1024 * 1024

# Globals torch's weights-only unpickler allows (torch._weights_only_unpickler._get_allowed_globals).
_SAFE_GLOBALS = frozenset({
    ("_codecs", "encode"), ("builtins", "bytearray"), ("builtins", "complex"), ("builtins", "set"),
    ("collections", "Counter"), ("collections", "OrderedDict"),
    ("torch", "Size"), ("torch", "Tensor"), ("torch", "device"),
    ("torch._tensor", "_rebuild_from_type_v2"), ("torch.nn.parameter", "Parameter"),
    ("torch.serialization", "_get_layout"),
    ("torch.storage", "TypedStorage"), ("torch.storage", "UntypedStorage"),
})
_SAFE_TORCH_NAME = re.compile(
    r"(?:[A-Z][A-Za-z0-9]*(?:Storage|Tensor)"  # FloatStorage, cuda.HalfTensor, ...
    r"|u?int\d+|float\d+(?:_\w+)?|bfloat16|complex\d+|bool|bits\w+|q(?:u)?int\w+"  # dtypes
    r"|per_(?:tensor|channel)_\w+)"  # quantization schemes
)
_SAFE_TORCH_MODULES = ("torch", "torch.cuda", "torch.sparse", "torch.cuda.sparse")
_SAFE_REBUILD = re.compile(r"_rebuild_\w+")

_STRING_OPCODES = frozenset({"UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8",
                             "STRING", "BINSTRING", "SHORT_BINSTRING"})
_MEMO_OPCODES = frozenset({"MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"})
_STACK_NEUTRAL_OPCODES = frozenset({"PROTO", "FRAME"})
_GET_OPCODES = frozenset({"GET", "BINGET", "LONG_BINGET"})

# Functions a SymInt expression may call: sympy's printing of torch's shape expressions
# (torch/_export/serde/serialize.py: ExportedProgramDeserializer.sympy_functions, and sympy core).
_SYMPY_FUNCTIONS = frozenset({
    "Symbol", "Integer", "Float", "Rational", "Add", "Mul", "Pow", "Mod", "Max", "Min", "Abs",
    "floor", "ceiling", "sqrt", "exp", "log", "sin", "cos", "tan", "asin", "acos", "atan", "sinh",
    "cosh", "tanh", "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "Equality", "Unequality", "StrictLessThan",
    "StrictGreaterThan", "LessThan", "GreaterThan", "And", "Or", "Not", "Xor", "Piecewise", "ITE",
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "CleanDiv", "CeilToInt", "FloorToInt",
    "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv", "IntTrueDiv",
    "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt", "RoundToInt", "RoundDecimal",
    "ToFloat", "Identity",
})
_SYMPY_FUNCTION_FAMILIES = re.compile(r"(?:OpaqueUnaryFn|BitwiseFn)_[a-z_]+")
_PYTHON_BUILTINS = frozenset(dir(builtins))
# defaultdict factories a treespec may name: torch imports their module and calls them with no
# argument for a missing key.
_SAFE_FACTORIES = frozenset({
    ("builtins", name) for name in ("list", "dict", "set", "frozenset", "tuple", "int", "float", "str", "bool",
                                    "bytes", "complex")
} | {("collections", name) for name in ("OrderedDict", "Counter", "deque", "defaultdict")})
_NESTED_JSON_LIMIT = 1024 * 1024  # a treespec string longer than this is not decoded but refused
_EXPRESSION_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Call, ast.Name,
                     ast.Constant, ast.Tuple, ast.keyword, ast.Load, ast.operator, ast.unaryop, ast.boolop,
                     ast.cmpop)


@dataclass(frozen=True)
class UnsafeMember:
    """A member of the archive that would run code when loaded, and why."""

    member: str
    reason: str

    def __str__(self) -> str:
        return f"{self.member} ({self.reason})"


def find_unsafe_members(path: Path | str) -> list[UnsafeMember]:
    """Every member of the .pt2 at `path` that `torch.export.load` would unpickle or evaluate.

    Raises zipfile.BadZipFile or OSError when `path` is not a readable zip file.
    """
    with zipfile.ZipFile(path) as archive:
        return list(_ArchiveScan(archive).findings())


def describe_unsafe_members(members: list[UnsafeMember], limit: int = 3) -> str:
    """One sentence naming the first `limit` members."""
    named = "; ".join(str(member) for member in members[:limit])
    more = f"; and {len(members) - limit} more" if len(members) > limit else ""
    return (f"it holds {len(members)} member(s) that would run code when torch.export.load reads them "
            f"(a pickle runs code when unpickled): {named}{more}")


class _ArchiveScan:
    def __init__(self, archive: zipfile.ZipFile) -> None:
        self.archive = archive
        names = archive.namelist()
        # torch's reader (PyTorchFileReader) looks records up under the first entry's folder.
        self.prefix = names[0].split("/", 1)[0] + "/" if names and "/" in names[0] else ""
        self.inner = {name[len(self.prefix):]: name for name in names if name.startswith(self.prefix)}

    def findings(self) -> Iterator[UnsafeMember]:
        yield from self._duplicates()
        for inner, name in self.inner.items():
            if inner.startswith("data/aotinductor/"):
                yield UnsafeMember(name, "AOTInductor compiled code, which torch.export.load opens")
            elif inner.startswith("models/") and inner.endswith(".json"):
                yield from self._model(name)
            elif inner.startswith("data/weights/") and inner.endswith("_weights_config.json"):
                yield from self._payload_config(name, "data/weights/", constants=False)
            elif inner.startswith("data/constants/") and inner.endswith("_constants_config.json"):
                yield from self._payload_config(name, "data/constants/", constants=True)
            elif _weights_only_first(inner):
                yield from self._torch_save(name)
        # The pre-2.7 flat layout, read by torch.export.load when load_pt2 fails.
        scanned = set(self.inner.values())
        for name in self.archive.namelist():
            if "/" not in name and _weights_only_first(name) and name not in scanned:
                yield from self._torch_save(name)

    def _duplicates(self) -> Iterator[UnsafeMember]:
        seen: set[str] = set()
        for name in self.archive.namelist():
            if name in seen:
                yield UnsafeMember(name, "the entry appears twice: which copy torch reads cannot be checked")
            seen.add(name)

    def _payload_config(self, name: str, directory: str, *, constants: bool) -> Iterator[UnsafeMember]:
        try:
            config = json.loads(self.archive.read(name))
        except ValueError:
            return  # torch's json.loads fails the same way, before reading any payload of this config
        entries = config.get("config") if isinstance(config, dict) else None
        if not isinstance(entries, dict):
            return  # torch cannot make a PayloadConfig of it either, and stops before any payload
        kind = "constant" if constants else "weight"
        for fqn, entry in entries.items():
            if not isinstance(entry, dict) or not isinstance(entry.get("path_name"), str):
                yield UnsafeMember(name, f"{kind} {fqn!r}: an entry this check cannot read")
                continue
            member = self.prefix + posixpath.join(directory, entry["path_name"])
            file_name = entry["path_name"]
            if constants and file_name.startswith("custom_obj_"):
                yield UnsafeMember(member, f"constant {fqn!r}: a custom object, unpickled by TorchScript")
            elif constants and file_name.startswith("opaque_obj_"):
                yield UnsafeMember(member, f"constant {fqn!r}: an opaque object, read with pickle.loads")
            elif entry.get("use_pickle"):
                yield UnsafeMember(member, f"{kind} {fqn!r} is marked use_pickle: "
                                           "torch.load(weights_only=False)")
            elif constants and not file_name.startswith("tensor_"):
                yield UnsafeMember(member, f"constant {fqn!r}: a kind of payload this check does not know")

    def _torch_save(self, name: str) -> Iterator[UnsafeMember]:
        reason = "read with torch.load(weights_only=True), then weights_only=False if that fails"
        if self.archive.getinfo(name).file_size == 0:
            return  # torch reads an empty artifact as {}
        with self.archive.open(name) as stream:
            # torch.load takes the zip route only for a file that starts with a zip header
            if stream.read(4) != b"PK\x03\x04":
                yield UnsafeMember(name, f"not a zip torch.save file; {reason}")
                return
        with self.archive.open(name) as stream:
            problem = _torch_save_problem(stream)
        if problem is not None:
            yield UnsafeMember(name, f"{problem}; {reason}")

    def _model(self, name: str) -> Iterator[UnsafeMember]:
        try:
            document = json.loads(self.archive.read(name))
        except ValueError:
            return  # torch's json parsing fails the same way, before any expression is evaluated
        for expression in _expression_strings(document):
            problem = _expression_problem(expression)
            if problem is not None:
                shown = expression if len(expression) <= 80 else expression[:77] + "..."
                yield UnsafeMember(name, f"shape expression {shown!r} {problem}: torch evaluates it "
                                         "with sympy.sympify, which runs Python")
        for problem in sorted(set(_structure_imports(document))):
            yield UnsafeMember(name, f"{problem}: torch's pytree reader imports it, which runs the module's code")


def _weights_only_first(inner: str) -> bool:
    """Members torch reads with `deserialize_torch_artifact` (weights_only=True, then False)."""
    if inner.startswith(("data/weights/", "data/constants/")):
        return inner.endswith(".pt")
    if inner.startswith("data/sample_inputs/"):
        return True
    return "/" not in inner and inner.startswith("serialized_") and inner != "serialized_exported_program.json"


def _torch_save_problem(stream: IO[bytes]) -> str | None:
    """Why the torch.save zip in `stream` could run code when unpickled, or None."""
    try:
        with zipfile.ZipFile(stream) as saved:
            infos = saved.infolist()
            names = [info.filename for info in infos]
            if len(set(names)) != len(names):
                return "a torch.save file with duplicate entries"
            if any(posixpath.basename(name) == "constants.pkl" for name in names):
                return "a TorchScript archive (torch.load hands it to torch.jit.load)"
            pickles = [info for info in infos if info.filename.endswith(".pkl")]
            for info in pickles:
                if info.file_size > PICKLE_SCAN_LIMIT:
                    return f"{info.filename} is a pickle over {PICKLE_SCAN_LIMIT} bytes, too large to check"
                with saved.open(info) as pickle_stream:
                    unsafe = _unsafe_globals(pickle_stream)
                if unsafe:
                    return f"its pickle calls {', '.join(sorted(unsafe)[:3])}"
    except (zipfile.BadZipFile, OSError, ValueError) as error:
        return f"a torch.save file this check cannot read ({error})"
    return None


def _unsafe_globals(stream: IO[bytes]) -> set[str]:
    """The globals a pickle loads that are not weights-only safe ("?" where one cannot be known)."""
    unsafe: set[str] = set()
    memo: dict[int, str | None] = {}
    recent: list[str | None] = []  # what the last stack pushes were: a known string or None
    for opcode, argument, _ in pickletools.genops(stream):
        name = opcode.name
        if name in ("GLOBAL", "INST"):
            module, _, attribute = str(argument).partition(" ")
            if not _safe_global(module, attribute):
                unsafe.add(f"{module}.{attribute}")
        elif name == "STACK_GLOBAL":
            if len(recent) < 2 or recent[-1] is None or recent[-2] is None:
                unsafe.add("? (a global named by computed strings)")
            elif not _safe_global(recent[-2], recent[-1]):
                unsafe.add(f"{recent[-2]}.{recent[-1]}")
        elif name.startswith("EXT"):
            unsafe.add("? (a global from the copyreg extension registry)")
        if name in _MEMO_OPCODES:
            memo[len(memo) if name == "MEMOIZE" else int(argument)] = recent[-1] if recent else None
            continue  # the stack is unchanged
        if name in _STACK_NEUTRAL_OPCODES:
            continue
        if name in _STRING_OPCODES:
            recent.append(argument.decode("latin-1") if isinstance(argument, bytes) else str(argument))
        elif name in _GET_OPCODES:
            recent.append(memo.get(int(argument)))
        else:
            recent.append(None)
        del recent[:-2]
    return unsafe


def _safe_global(module: str, name: str) -> bool:
    if (module, name) in _SAFE_GLOBALS:
        return True
    if module == "torch._utils":
        return _SAFE_REBUILD.fullmatch(name) is not None
    return module in _SAFE_TORCH_MODULES and _SAFE_TORCH_NAME.fullmatch(name) is not None


def _expression_strings(document: Any) -> Iterator[str]:
    """Every `expr_str` in a serialized ExportedProgram (SymInt, SymFloat and SymBool values)."""
    stack = [document]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if key == "expr_str":
                    yield item if isinstance(item, str) else repr(item)
                else:
                    stack.append(item)
        elif isinstance(value, list):
            stack.extend(value)


def _structure_imports(value: Any, depth: int = 0) -> Iterator[str]:
    """What a treespec in `value` would make torch import that is not torch's own or a builtin.

    Treespecs are JSON strings inside the model's JSON, and their contexts JSON strings again:
    every string that reads as JSON is decoded (a few levels deep) and searched, whatever its key,
    so the check does not depend on where torch's format keeps them.
    """
    if isinstance(value, dict):
        if "__enum__" in value:
            fqn = value.get("fqn")
            module = fqn.partition(":")[0] if isinstance(fqn, str) else "?"
            if not _torch_module(module):
                yield f"an enum of module {module!r} in the program's input or output structure"
        if "default_factory_module" in value or "default_factory_name" in value:
            factory = (value.get("default_factory_module"), value.get("default_factory_name"))
            if factory not in _SAFE_FACTORIES:
                yield f"a defaultdict whose factory is {factory[0]!r}.{factory[1]!r}"
        for item in value.values():
            yield from _structure_imports(item, depth)
    elif isinstance(value, list):
        for item in value:
            yield from _structure_imports(item, depth)
    elif isinstance(value, str) and value.lstrip()[:1] in ("[", "{"):
        if depth >= 6 or len(value) > _NESTED_JSON_LIMIT:
            yield "an input or output structure nested too deeply or too large to check"
            return
        try:
            decoded = json.loads(value)
        except ValueError:
            return
        yield from _structure_imports(decoded, depth + 1)


def _torch_module(module: str) -> bool:
    return module == "torch" or module.startswith("torch.")


def _expression_problem(expression: str) -> str | None:
    """Why `expression` is more than sympy arithmetic over symbols, or None.

    Allowed: numbers, symbol names, operators, tuples, calls of the sympy functions torch prints,
    with keyword flags (`Symbol('s0', positive=True, integer=True)`). Strings only name symbols.
    """
    try:
        tree = ast.parse(expression, mode="eval")
    except (SyntaxError, ValueError):
        return "is not a plain expression"
    symbol_names = {id(arg) for node in ast.walk(tree) if isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name) and node.func.id == "Symbol" for arg in node.args[:1]}
    for node in ast.walk(tree):
        if not isinstance(node, _EXPRESSION_NODES):
            return f"uses {type(node).__name__}"
        if isinstance(node, ast.Call):
            function = node.func.id if isinstance(node.func, ast.Name) else None
            if function is None or not (function in _SYMPY_FUNCTIONS or _SYMPY_FUNCTION_FAMILIES.fullmatch(function)):
                return f"calls {ast.unparse(node.func)}"
        elif isinstance(node, ast.Name) and (node.id.startswith("_") or node.id in _PYTHON_BUILTINS):
            return f"names {node.id}"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str | bytes) and id(node) not in symbol_names:
            return "holds a string that does not name a symbol"
        elif isinstance(node, ast.keyword) and node.arg is None:
            return "unpacks keywords"
    return None


def starts_as_pickle(head: bytes) -> bool:
    """Whether a file's first bytes are a pickle's (the PROTO opcode of protocol 2 to 5), as a raw
    `torch.save` or `pickle.dump` writes."""
    return head[:1] == b"\x80" and head[1:2] in _PICKLE_PROTOCOLS


def describe_not_a_zip(path: Path | str) -> str:
    """What a file that is not a zip is instead, as far as its first bytes tell: empty, a pickle, a
    zip cut short, text (HLO or StableHLO, which the spec's program_format takes, or other) or
    other bytes."""
    with open(path, "rb") as file:
        head = file.read(_HEAD_BYTES)
    if not head:
        return "the file is empty (0 bytes)"
    if starts_as_pickle(head):
        return "it is a pickle (torch.save of an object, not torch.export.save of a program)"
    if head.startswith(_ZIP_MEMBER_MAGIC):
        return "it begins as a zip but its end (the zip's directory) is missing: a truncated upload or copy?"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        if head.startswith(MLIR_BYTECODE_MAGIC):
            return "it is MLIR bytecode: submit it as StableHLO (a .mlirbc name, or program_format stablehlo)"
        return f"it is neither a zip nor text (it starts {head[:8].hex(' ')})"
    first_line = text.strip().splitlines()[0][:60] if text.strip() else ""
    if text.lstrip().startswith("{"):
        return "it is JSON: submit minify's program.json as such (a .json name, or program_format fx_json)"
    if text.lstrip().startswith("HloModule"):
        return "it is HLO text: submit it as HLO (a .hlo name, or program_format hlo)"
    if "func.func" in text or "func @" in text:
        return "it is MLIR text: submit it as StableHLO (a .mlir name, or program_format stablehlo)"
    return f"it is a text file (it starts {first_line!r})"
