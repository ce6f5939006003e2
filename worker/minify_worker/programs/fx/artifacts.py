"""A `.pt2` job's own files, written in a sandbox child (`write_program_artifacts`, the FX
representation's `artifacts_target`: it needs the value store and torch.export): minimized.pt2,
inputs.pt, repro.py, signature_rules.py (and accuracy_rules.py beside an accuracy repro). Where
torch.export cannot export or save the minimal program (a `while_loop` carrying a Python int), or
would keep only the forward of a custom autograd.Function the failure needs the backward of, it
is minimized.json instead, in minify's program.json format: `minify-worker minify minimized.json
--inputs inputs.pt` takes it back (inputs.pt holds its placeholders' values in order). The
delivered files' names and the storage rule are `minify_worker.engine.artifacts`'.

repro.py holds its inputs inline when they are a few elements, each written exactly (a repro that
fits in an issue); else it reads them from inputs.pt, which keeps exact bits, dtypes, strides and
scalar types for any size. Either way the values are the job's: an accuracy or data-dependent
failure may hinge on them (torch's own repros regenerate random inputs and can lose the failure
that way).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from minify_contract import program_json, zero_tensors
from minify_contract.accuracy import clone_input
from minify_contract.models import JobSpec
from minify_worker.engine.artifacts import (
    ACCURACY_RULES,
    INPUTS,
    MINIMIZED,
    MINIMIZED_JSON,
    REPRO,
    SIGNATURE_RULES,
    ArtifactWriteError,
    write_artifact,
)
from minify_worker.outcomes import Signature, signature_from_dict
from minify_worker.programs.fx.backends import (
    as_torch_functions,
    dynamic_shapes_of,
    export_dynamic_shapes,
    uses_torch_functions,
)
from minify_worker.programs.fx.graph import (
    META_NARROW,
    META_VALUE,
    graph_from_wire,
    graph_to_wire,
    holds_autograd_functions,
    placeholders,
    to_graph_module,
)
from minify_worker.programs.fx.repro import accuracy_rules_module, render_repro, signature_rules_module
from minify_worker.programs.fx.shrink import narrowed

InputValue = torch.Tensor | int | float | bool


def _saved(save: Callable[[Any, io.BytesIO], object], value: Any) -> Callable[[Path], object]:
    """Serialize `value` with `save` (torch.save, torch.export.save) now; the result writes the bytes.

    torch's writers report a failed write as a RuntimeError of their own; a plain write of their
    bytes fails with the OSError (ENOSPC, EFBIG) that says the disk is full.
    """
    buffer = io.BytesIO()
    save(value, buffer)
    return lambda path: path.write_bytes(buffer.getbuffer())


# ---------------------------------------------------------------------------------------------
# In the sandbox child: minimized.pt2, inputs.pt, repro.py


def write_program_artifacts(
    context: Any,
    *,
    wire_graph: dict[str, Any],
    out_dir: str,
    spec_json: str,
    signature: dict[str, Any] | None = None,
    environment: Mapping[str, str] | None = None,
    culprit_lines: list[str] | None = None,
    hang_bound_s: float | None = None,
) -> dict[str, Any]:
    """Write minimized.pt2, inputs.pt and repro.py for the minimized graph: a `SandboxPool.call` target.

    `context.values` is the value store the sandbox child holds; `wire_graph` is `graph_to_wire`'s
    form, `spec_json` the JobSpec as JSON, `signature` the target `Signature` as a dict (asdict),
    `environment` the worker's (`environment.collect`), for repro.py's header, as are
    `culprit_lines` (the culprit phase's finding: `culprit.header_lines`); `hang_bound_s` the
    longest a hang's result was seen still running (repro.py holds its run to it).
    Returns `{"files": [names written], "errors": {name: message}}`: a program torch.export
    refuses still gets its inputs.pt and repro.py. `out_dir` must be absolute (nothing is
    written otherwise, and every file is an error). A write the storage refused (a full disk)
    adds `"storage_error": [name, [errno, strerror]]` (`raise_storage_error` raises it again).
    """
    if not Path(out_dir).is_absolute():
        # A sandbox child works in a folder of its own: a relative out_dir would put the files
        # where nobody looks, and the caller would list files that are not where it says.
        reason = f"out_dir {out_dir!r} is relative; the sandbox child needs an absolute folder"
        return {"files": [], "errors": {name: reason for name in (INPUTS, REPRO, MINIMIZED)}}
    graph = graph_from_wire(wire_graph)
    spec = JobSpec.model_validate_json(spec_json)
    target = signature_from_dict(signature) if signature is not None else None
    try:
        return write_program_files(graph, context.values, Path(out_dir), spec, target, environment, culprit_lines,
                                   hang_bound_s)
    except ArtifactWriteError as error:
        cause = error.__cause__
        assert isinstance(cause, OSError)
        return {"files": [], "errors": {error.name: str(error)},
                "storage_error": [error.name, [cause.errno, cause.strerror]]}


def write_program_files(
    graph: fx.Graph,
    values: Mapping[str, InputValue],
    out_dir: Path,
    spec: JobSpec,
    signature: Signature | None = None,
    environment: Mapping[str, str] | None = None,
    culprit_lines: list[str] | None = None,
    hang_bound_s: float | None = None,
) -> dict[str, Any]:
    """`write_program_artifacts` over an in-memory graph and value store."""
    out_dir.mkdir(parents=True, exist_ok=True)
    inputs = graph_inputs(graph, values)
    files: list[str] = []
    errors: dict[str, str] = {}

    # A ZeroTensor input as its marker (zero_tensors), which repro.py rebuilds it from.
    write_artifact(out_dir / INPUTS, _saved(torch.save, zero_tensors.encode(inputs)))
    files.append(INPUTS)
    # A registered backend receives candidates as dynamo's form (torch functions): so does the repro's.
    shown = as_torch_functions(to_graph_module(graph), inputs).graph if uses_torch_functions(spec.backend) else graph
    kind = signature.kind if signature is not None else spec.failure.kind
    # On the CPU only: an eager index out of bounds on a GPU is a device-side assert, which would
    # leave this child's CUDA context unusable for the files still to write.
    eager_error = eager_raises(graph, inputs) if kind == "crash" and spec.device == "cpu" else None
    repro = render_repro(shown, spec, signature, torch.__version__, environment, culprit_lines, inputs=inputs,
                         eager_error=eager_error, hang_bound_s=hang_bound_s)
    write_artifact(out_dir / REPRO, lambda path: path.write_text(repro))
    files.append(REPRO)
    rules = signature_rules_module()
    write_artifact(out_dir / SIGNATURE_RULES, lambda path: path.write_text(rules))
    files.append(SIGNATURE_RULES)
    # An accuracy repro judges by its rule; a training repro copies its inputs as the worker does
    # (its `clone_inputs`: copies requiring grad are no leaves, as the compile saw them).
    if kind == "accuracy" or spec.failure.training:
        accuracy_rules = accuracy_rules_module()
        write_artifact(out_dir / ACCURACY_RULES, lambda path: path.write_text(accuracy_rules))
        files.append(ACCURACY_RULES)
    try:
        program = export_minimized(graph, inputs, spec.device, dynamic=spec.dynamic)
        write_minimized = _saved(zero_tensors.save_program, program)
    except Exception as error:  # a user program can fail to export in any way; report, don't die
        errors[MINIMIZED] = f"{type(error).__name__}: {error}"
        # What torch.export refuses, minify's own format holds: minimized.json beside inputs.pt.
        text = json.dumps(program_json.document(graph_to_wire(graph), torch_version=torch.__version__,
                                                why=f"torch.export cannot write it ({_first_line(error)})"))
        write_artifact(out_dir / MINIMIZED_JSON, lambda path: path.write_text(text))
        files.append(MINIMIZED_JSON)
    else:
        write_artifact(out_dir / MINIMIZED, write_minimized)
        files.append(MINIMIZED)
    return {"files": files, "errors": errors}


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def eager_raises(graph: fx.Graph, inputs: Sequence[InputValue]) -> str | None:
    """What `graph` raises when run eagerly on `inputs` (`Type: message`), or None where it runs: a
    crash whose program raises eagerly is a clean error the compiled program turned into a death."""
    try:
        with torch.no_grad():
            to_graph_module(graph)(*[clone_input(value) if isinstance(value, torch.Tensor) else value
                                     for value in inputs])
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return None


def graph_inputs(graph: fx.Graph, values: Mapping[str, InputValue]) -> tuple[InputValue, ...]:
    """The values of `graph`'s placeholders, in order, on the CPU (as the value store keeps them; a
    shrunk input sliced to its `minify_narrow` sizes, as the candidate read it: `shrink.narrowed`)."""
    inputs = []
    for node in placeholders(graph):
        key = node.meta.get(META_VALUE, node.name)
        if key not in values:
            raise KeyError(f"placeholder {node.name!r}: no value {key!r} in the value store")
        # As stored (a shrunk input as its candidate read it), not cloned: torch.save keeps a
        # view's strides and offset, which a layout-sensitive compiler bug may need.
        inputs.append(narrowed(values[key], node.meta.get(META_NARROW)))
    return tuple(inputs)


def export_minimized(
    graph: fx.Graph, inputs: Sequence[InputValue], device: str = "cpu", *, dynamic: str = "as_exported"
) -> torch.export.ExportedProgram:
    """Export the graph with every placeholder as a user input named after its node.

    This is the shape torch's AOTI minifier saves: `export_load(path).module()` has
    `forward(self, linear)` when `linear` was promoted to an input. The inputs' dynamic dims stay
    dynamic (`dynamic`, the JobSpec's: their `Dim`s with the program's ranges, so the program's
    `range_constraints` keep them; `Dim.AUTO` for "auto"; none for "static").
    """
    if holds_autograd_functions(graph):
        raise ValueError("torch.export keeps the forward only of a custom autograd.Function "
                         "(autograd_function_apply), whose backward the failure needs")
    module = to_graph_module(graph)
    args = tuple(_to_device(value, device) for value in inputs)
    shapes = export_dynamic_shapes(dynamic_shapes_of(graph, dynamic))
    with torch.no_grad():
        return torch.export.export(module, args, dynamic_shapes=shapes)


def _to_device(value: InputValue, device: str) -> InputValue:
    return zero_tensors.to_device(value, device) if isinstance(value, torch.Tensor) else value
