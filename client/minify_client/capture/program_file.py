"""The program file a capture writes: a `.pt2`, or program.json where torch.export.save refuses.

torch.export keeps programs its own serializer cannot write on torch 2.13 (a `while_loop` that
carries a Python int, pytorch#166525; `flex_attention`'s block-mask tuple of ints, None and
tensors) or writes one it cannot load back. Such a program is still a program minify minimizes:
it is written as `<name>.json`, minify's own format (`minify_contract.program_json`: the graph as
the worker's wire form, JSON, nothing pickled), and its inputs file holds every placeholder's value
by name (parameters and buffers too), read with `torch.load(weights_only=True)`. The spec says
`program_format: fx_json`. A program holding higher-order ops is saved and loaded back before it
is kept as a `.pt2`, so a `.pt2` the worker could not load is never what a job gets.

The user's program is only read: its ExportedProgram, inputs and state are not changed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minify_contract import program_json, zero_tensors
from minify_contract.models import JobSpec

from .higher_order import CaptureRefused, higher_order_ops, root_cause

INPUTS = "inputs.pt"
PROGRAM_FORMAT_JSON = "fx_json"


@dataclass(frozen=True)
class ProgramFile:
    """What was written: the program file's name in the folder and its `program_format`."""

    name: str
    program_format: str

    def described_by(self, spec: JobSpec) -> JobSpec:
        """`spec` with this file's `program_format`."""
        if spec.program_format == self.program_format:
            return spec
        return spec.model_copy(update={"program_format": self.program_format})


@dataclass(frozen=True)
class GraphProgram:
    """A program no ExportedProgram can hold, as an aten-level GraphModule (`module`, every
    placeholder an input): written as program.json, `why` saying why it is not a `.pt2`."""

    module: Any
    why: str


class _NotSavable(Exception):
    """torch.export.save cannot write the program, or torch.export.load cannot read it back."""


def write_program(program: Any, args: Sequence[Any], kwargs: dict[str, Any], directory: Path,
                  name: str) -> ProgramFile:
    """Write `program` (an ExportedProgram) and its inputs into `directory`: `<name>.pt2` and
    inputs.pt as `(args, kwargs)`, or, where torch cannot save it or load it back, `<name>.json`
    and inputs.pt as every placeholder's value by name. Raises `CaptureRefused` when neither can
    hold it. A `GraphProgram` is written as program.json, its inputs being `args`, in order."""
    import torch

    if isinstance(program, GraphProgram):
        why_not = program.why
    else:
        pt2 = directory / f"{name}.pt2"
        try:
            _save_pt2(program, pt2)
        except _NotSavable as refusal:
            pt2.unlink(missing_ok=True)
            why_not = str(refusal)
        else:
            # A ZeroTensor input goes in as a marker the worker rebuilds it from (zero_tensors).
            torch.save(zero_tensors.encode((tuple(args), kwargs)), directory / INPUTS)
            return ProgramFile(pt2.name, "pt2")
    try:
        if isinstance(program, GraphProgram):
            document, values = graph_program_json(program, args)
        else:
            document, values = as_program_json(program, args, kwargs, why=why_not)
    except Exception as error:
        raise CaptureRefused(f"{why_not}, and minify's program.json cannot hold it either ({root_cause(error)}): "
                             "the failing graph is not captured") from error
    (directory / f"{name}.json").write_text(json.dumps(document))
    torch.save(zero_tensors.encode(values), directory / INPUTS)
    return ProgramFile(f"{name}.json", PROGRAM_FORMAT_JSON)


def _save_pt2(program: Any, path: Path) -> None:
    """torch.export.save `program` to `path`; one holding higher-order ops is loaded back too,
    since some save but do not load. Raises `_NotSavable` with torch's reason (a write the disk
    refuses is an OSError, raised as it is)."""
    import torch

    ops = higher_order_ops(program.graph_module.graph)
    step = "torch.export.save cannot write"
    try:
        zero_tensors.save_program(program, path)
        if ops:
            step = "torch.export.load cannot read back"
            torch.export.load(path)
    except OSError:
        raise
    except Exception as error:
        held = f" holding the higher-order op{'s' if len(ops) > 1 else ''} {', '.join(ops)}" if ops else ""
        raise _NotSavable(f"{step} the program{held} on torch {torch.__version__} ({root_cause(error)})") from error


def as_program_json(program: Any, args: Sequence[Any], kwargs: dict[str, Any], *,
                    why: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """program.json's document for `program` and every placeholder's value by its name there."""
    import torch

    from minify_contract.fx.ingest import flat_graph_from_exported_program
    from minify_contract.fx.wire import graph_to_wire

    graph = flat_graph_from_exported_program(program)
    values = placeholder_values(program, [node.name for node in graph.nodes if node.op == "placeholder"],
                                args, kwargs)
    return program_json.document(graph_to_wire(graph), torch_version=torch.__version__, why=why), values


def graph_program_json(program: GraphProgram, args: Sequence[Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """program.json's document for `program` and its placeholders' values by name (`args`, in order)."""
    import torch

    from minify_contract.fx.ingest import flat_graph_from_module
    from minify_contract.fx.wire import graph_to_wire

    graph = flat_graph_from_module(program.module)
    names = [node.name for node in graph.nodes if node.op == "placeholder"]
    if len(names) != len(args):
        raise ValueError(f"the graph has {len(names)} inputs, {len(args)} values were given")
    values = {name: value.detach() if isinstance(value, torch.Tensor) else value
              for name, value in zip(names, args, strict=True)}
    return program_json.document(graph_to_wire(graph), torch_version=torch.__version__, why=program.why), values


def placeholder_values(program: Any, names: Sequence[str], args: Sequence[Any],
                       kwargs: dict[str, Any]) -> dict[str, Any]:
    """The value of each placeholder of `program` under its name in `names` (the flat copy's, in
    order): user inputs from `(args, kwargs)` flattened as export flattens them, parameters, buffers
    and constants from the program's state, detached (the user's tensors are not touched)."""
    import torch
    from torch.export.graph_signature import InputKind
    from torch.utils._pytree import tree_flatten

    given = iter(tree_flatten((tuple(args), dict(kwargs)))[0])
    values: dict[str, Any] = {}
    for spec, name in zip(program.graph_signature.input_specs, names, strict=True):
        if spec.kind == InputKind.USER_INPUT:
            value = next(given)
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            value = program.state_dict[spec.target] if spec.target in program.state_dict \
                else program.constants[spec.target]
        else:
            raise ValueError(f"input {spec.arg.name!r} is a {spec.kind.name.lower()}, which program.json cannot hold")
        values[name] = value.detach() if isinstance(value, torch.Tensor) else value
    return values
