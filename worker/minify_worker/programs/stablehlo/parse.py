"""Reading a StableHLO or HLO program into `module.Module` (sandbox children only: jax's MLIR).

Accepted: MLIR text (`jax.jit(f).lower(...).as_text()`), MLIR bytecode, a portable VHLO artifact
(`jax.export`'s serialization, `stablehlo.serialize_portable_artifact`), and HLO text as XLA
dumps it (`XLA_FLAGS=--xla_dump_to=DIR`, from torch_xla or jax: `*.before_optimizations.txt`),
converted to StableHLO by XLA's own translation (`hlo_module_from_text`, `hlo_to_stablehlo`).
Checked on jax/jaxlib 0.10.2.
"""

from __future__ import annotations

import io
import re
from typing import Any

from .module import Global, Module, Op, Value, catalog, references, symbols

BYTECODE_MAGIC = b"ML\xefR"

# A printed name of a top-level value (`%0`, `%arg1`, `%cst_2`, `%4#1`), outside string literals.
_PRINTED = re.compile(r'"(?:[^"\\]|\\.)*"|(?P<name>%[\w$.\-]+(?:#\d+)?)')
# What an op's printed form starts with when it has results: `%0 = `, `%4:2 = `, `%a, %b = `.
_RESULTS = re.compile(r"^\s*%[\w$.\-]+(?::\d+)?(?:\s*,\s*%[\w$.\-]+(?::\d+)?)*\s*=\s*")


class ParseError(Exception):
    """The file is not a StableHLO or HLO program this reader can use; the message says why."""


def program_format(data: bytes) -> str:
    """`hlo` (HLO text), `bytecode` (MLIR or VHLO bytecode) or `mlir` (MLIR text), from the content."""
    if data.startswith(BYTECODE_MAGIC):
        return "bytecode"
    head = data.lstrip()[:64]
    if head.startswith(b"HloModule"):
        return "hlo"
    return "mlir"


def context() -> Any:
    """An MLIR context with every dialect jax registers (stablehlo, chlo, func, sdy, ...)."""
    from jax._src.interpreters import mlir

    return mlir.make_ir_context()


def parse_mlir(data: bytes, ctx: Any) -> Any:
    """The `ir.Module` of `data` in any accepted format."""
    from jax._src.lib.mlir import ir

    kind = program_format(data)
    if kind == "hlo":
        data = hlo_to_stablehlo(data.decode("utf-8", errors="replace"))
        kind = "bytecode"
    if kind == "bytecode":
        from jaxlib.mlir._mlir_libs import _stablehlo

        try:  # a portable artifact becomes StableHLO; plain StableHLO bytecode reads as is
            return _stablehlo.deserialize_portable_artifact(ctx, data)
        except Exception:
            pass
    try:
        return ir.Module.parse(data if kind == "bytecode" else data.decode("utf-8"), context=ctx)
    except Exception as error:
        raise ParseError(f"not a StableHLO module MLIR can parse: {_first_line(error)}") from error


def hlo_to_stablehlo(text: str) -> bytes:
    """HLO text -> StableHLO bytecode, by XLA's translation."""
    from jax._src.lib import _jax, xla_client

    try:
        hlo = xla_client.hlo.hlo_module_from_text(text)
    except Exception as error:
        raise ParseError(f"not HLO text XLA can parse: {_first_line(error)}") from error
    return _jax.mlir.hlo_to_stablehlo(hlo.as_serialized_hlo_module_proto())


def read(data: bytes) -> Module:
    """The program in `data` as a `Module` (no value recorded yet)."""
    from jax._src.lib.mlir import ir

    ctx = context()
    parsed = parse_mlir(data, ctx)
    with ctx:
        return from_ir(parsed, ir)


def from_ir(parsed: Any, ir: Any) -> Module:
    top = [op.operation for op in parsed.body.operations]
    main = _main_function(top, ir)
    state = ir.AsmState(main)
    block = main.regions[0].blocks[0]
    names: dict[str, str] = {}
    args = []
    for position, argument in enumerate(block.arguments):
        names[argument.get_name(state)] = f"a{position}"
        args.append(Value(f"a{position}", str(argument.type)))
    ops: list[Op] = []
    outputs: list[str] = []
    for index, operation in enumerate(op.operation for op in block.operations):
        if operation.name in ("func.return", "stablehlo.return"):
            outputs = [names[operand.get_name(state)] for operand in operation.operands]
            break
        results = []
        for number, result in enumerate(operation.results):
            result_key = f"v{index}" if len(operation.results) == 1 else f"v{index}#{number}"
            names[result.get_name(state)] = result_key
            results.append(Value(result_key, str(result.type)))
        printed = io.StringIO()
        operation.print(state=state, file=printed)
        body = _RESULTS.sub("", printed.getvalue().strip(), count=1) if results else printed.getvalue().strip()
        body = _rename(body, names)
        ops.append(Op(index, operation.name, tuple(results), tuple(references(body)), body, _nested(operation)))
    globals_ = []
    for operation in top:
        if operation == main:
            continue
        text = str(operation).strip()
        name = ir.StringAttr(operation.attributes["sym_name"]).value if "sym_name" in operation.attributes else ""
        globals_.append(Global(name, text, tuple(symbols(text))))
    module_op = parsed.operation
    name = ir.StringAttr(module_op.attributes["sym_name"]).value if "sym_name" in module_op.attributes else "program"
    attributes = [f"{attribute} = {module_op.attributes[attribute]}" for attribute in module_op.attributes
                  if attribute != "sym_name"]
    return Module(name=_symbol_name(name), attributes="{" + ", ".join(attributes) + "}" if attributes else "",
                  globals=tuple(globals_), args=tuple(args), ops=tuple(ops), outputs=tuple(outputs),
                  types=catalog(args, ops))


def _main_function(top: list[Any], ir: Any) -> Any:
    functions = [op for op in top if op.name == "func.func"]
    by_name = {ir.StringAttr(op.attributes["sym_name"]).value: op for op in functions}
    if "main" in by_name:
        return by_name["main"]
    public = [op for op in functions if "sym_visibility" not in op.attributes]
    if len(public) == 1:
        return public[0]
    raise ParseError(f"the module has no function named main (functions: {', '.join(by_name) or 'none'})")


def _rename(text: str, names: dict[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match["name"]
        if name is None or name not in names:
            return match[0]
        return "%m." + names[name]

    return _PRINTED.sub(replace, text)


def _nested(operation: Any) -> int:
    count = 0
    for region in operation.regions:
        for block in region.blocks:
            for inner in block.operations:
                count += 1 + _nested(inner.operation)
    return count


def _symbol_name(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z_][\w$.]*", name) else f'"{name}"'


def _first_line(error: BaseException) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:500]


def pretty(text: str) -> str:
    """`text` parsed and printed back: MLIR's own names and syntax, for a reader."""
    from jax._src.lib.mlir import ir

    ctx = context()
    return str(ir.Module.parse(text, context=ctx))
