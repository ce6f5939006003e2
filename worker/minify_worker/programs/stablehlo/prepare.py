"""Prepare a StableHLO or HLO program for minimization: the loader of `program_format` stablehlo
and hlo (`prepare_target`, a `SandboxPool.call` target, sandbox children only).

It writes what the FX loader writes (programs/fx/prepare.py), so the engine, the fork server and the children
need nothing else: `program.json` (`{"format": prepared.FORMAT, "graph": wire form, "metadata"}`)
and `values.pt` (a `torch.save` of `{key: tensor}`: every argument of main by `a<N>`, and every
intermediate with an array value by its key, `v<N>`), recorded from one run of the whole program
with XLA's default options on the spec's device: a candidate that promotes an intermediate to an
argument receives its real value. Where that run fails (the program does not compile even with
default options: a custom call with no handler), intermediates get values made from their types,
as arguments do without inputs (`metadata.intermediates` says which). Not StableHLO's
interpreter: it aborts the process on an op it does not know.

Inputs: an `.npz` of arrays (`--inputs inputs.npz`: `arg0, arg1, ...` or `np.savez(*arrays)`'s
`arr_0, ...` by number, else in the file's order), checked against main's argument types; without
one, made from the types (standard normal floats, integers 0 or 1, false booleans; seed 0).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from minify_worker.programs.prepared import FORMAT, PROGRAM_JSON, VALUES, ProgramError

from . import arrays as array_io
from . import xla
from .module import Module, render
from .parse import ParseError, program_format, read
from .representation import REPRESENTATION

INPUTS_HINT = "save them as numpy arrays in main's argument order: np.savez('inputs.npz', *arrays)"


def prepare_in_child(context: Any, *, program: str, inputs: str | None = None) -> dict[str, Any]:
    """`SandboxPool.call` target: `prepare` into the pool's work dir on the spec's device."""
    return prepare(Path(program), None if inputs is None else Path(inputs), Path(context.workdir),
                   device=context.spec.device)


def prepare(program: Path, inputs: Path | None, workdir: Path, device: str = "cpu") -> dict[str, Any]:
    """Read `program` (and `inputs`), write values.pt and program.json into `workdir`; returns the metadata."""
    import jax
    import torch

    if not program.is_file():
        raise ProgramError(f"program file {program.name} does not exist")
    data = program.read_bytes()
    try:
        module = read(data)
    except ParseError as error:
        raise ProgramError(f"{program.name}: {error}") from error
    arguments = read_inputs(inputs, module) if inputs is not None else generated_inputs(module)
    recordable = [value.key for op in module.ops for value in op.results if array_io.shape_of(value.type)]
    intermediates, how = record(module, arguments, recordable, device)
    values = {value.key: array_io.to_torch(array) for value, array in zip(module.args, arguments, strict=True)}
    values.update((key, array_io.to_torch(array)) for key, array in zip(recordable, intermediates, strict=True))
    module = replace(module, recorded=frozenset(recordable))
    workdir.mkdir(parents=True, exist_ok=True)
    torch.save(values, workdir / VALUES)
    metadata = {
        "source": program_format(data),
        "program": program.name,
        "arguments": [value.type for value in module.args],
        "outputs": [module.types.get(key, "") for key in module.outputs],
        "nodes_original": len(module.ops),
        "intermediates": how,
        "device": device,
        "jax_version": jax.__version__,
    }
    document = {"format": FORMAT, "graph": REPRESENTATION.to_wire(module), "metadata": metadata}
    (workdir / PROGRAM_JSON).write_text(json.dumps(document))
    return metadata


def read_inputs(path: Path, module: Module) -> list[np.ndarray]:
    if not path.is_file():
        raise ProgramError(f"inputs file {path.name} does not exist")
    try:
        given = array_io.read_npz(path)
    except Exception as error:
        raise ProgramError(f"cannot read inputs file {path.name} as an .npz of arrays: "
                           f"{type(error).__name__}: {error}; {INPUTS_HINT}") from error
    if len(given) != len(module.args):
        raise ProgramError(f"{path.name} holds {len(given)} arrays; main takes {len(module.args)} arguments "
                           f"({', '.join(value.type for value in module.args)}); {INPUTS_HINT}")
    checked = []
    for position, (value, array) in enumerate(zip(module.args, given, strict=True)):
        expected = array_io.shape_of(value.type)
        if expected is None:
            raise ProgramError(f"argument {position} has type {value.type}, which minify cannot give a value")
        dims, dtype = expected
        if array.dtype != dtype and array.dtype.itemsize == dtype.itemsize and array.dtype.kind in "uV":
            array = array.view(dtype)  # bfloat16 and float8 arrays saved as their bits
        if array.dtype != dtype or list(array.shape) != dims:
            raise ProgramError(f"argument {position} must be {value.type}, the file's array {position} is "
                               f"{array.dtype}{list(array.shape)}; {INPUTS_HINT}")
        checked.append(array)
    return checked


def generated_inputs(module: Module) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    try:
        return [array_io.generated(value.type, rng) for value in module.args]
    except ValueError as error:
        raise ProgramError(f"{error}: pass an inputs file") from error


def record(module: Module, arguments: list[np.ndarray], keys: list[str], device: str) -> tuple[list[np.ndarray], str]:
    """The values of `keys` from one run of the program, and how they were had."""
    everything = render(replace(module, outputs=tuple(keys)))
    try:
        return xla.compile_module(everything, {}, device)(arguments), "xla"
    except Exception:
        pass
    rng = np.random.default_rng(0)
    return [array_io.generated(module.types[key], rng) for key in keys], "generated"
