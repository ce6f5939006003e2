"""A failing compiler call as a program the engine loads: the graph exported, its inputs, its spec.

The graph a compiler received is straight-line: it is exported as a module with non-strict
`torch.export.export(graph, inputs, strict=False)` (no second dynamo trace to fail on what the
first one already handled). A backward graph is a plain function of its saved activations and
tangents, exported the same way. An AOTI failure is its ExportedProgram, as given.

A graph compiled with symbolic sizes is exported with them (`dynamic`: its size inputs become
dims of the tensors they size). When that export fails (a guard it cannot express), the graph is
exported static as before: the capture is never lost, a warning says why, the error gets a note,
`Program.static_reason` keeps the reason and the spec says `dynamic: static`. Floats dynamo made
symbolic are passed as constants either way (`dynamic.specialize_floats`).

A graph of `torch.func` transforms is exported lowered to the aten ops it computes
(`transforms.lower`), with static shapes. A graph holding higher-order ops keeps them (`higher_order`);
where torch cannot export it, `CaptureRefused` says so at capture time, naming the ops, and where
torch.export.save cannot write it or load it back, it is written as program.json (`program_file`).

The spec records the backend, the settings that differ from torch's defaults, and the failure:
its kind and its root-cause signature as `minify_contract.signatures` computes it (the worker's
oracle uses the same function), so the worker judges candidates against it from the first check.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from minify_contract import signatures
from minify_contract.accuracy import ACCURACY_EXC_TYPE, GRADIENT_EXC_TYPE
from minify_contract.models import JobSpec

from .autograd_functions import lower as lower_keeping_functions
from .config import changed_config
from .custom_ops import op_modules
from .destinations import add_note
from .dynamic import export_dynamic, is_symbolic, specialize_floats
from .fidelity import accuracy_signature, autograd_functions, needs_training, unreproducible
from .higher_order import CaptureRefused, export_refused, for_export, higher_order_ops, root_cause
from .program_file import GraphProgram
from .torch_hooks import FailedCompile
from .transforms import lower, transform_calls
from .whole_model import on_cuda

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Program:
    """What gets saved or submitted for one failing call."""

    program: Any  # torch.export.ExportedProgram, or a program_file.GraphProgram (written as program.json)
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    spec: JobSpec
    chain: tuple[str, ...]
    static_reason: str | None = None  # why a graph compiled with symbolic sizes was exported static


def signature_of(failed: FailedCompile) -> str:
    """The failure's signature as the worker's report writes it ("Type: normalized key")."""
    if failed.kind == "accuracy" and type(failed.error).__name__ in (ACCURACY_EXC_TYPE, GRADIENT_EXC_TYPE):
        return accuracy_signature(failed.error)  # keyed as the worker keys it (fidelity.py)
    return signatures.signature_line(failed.error)  # a MissingError is keyed by eager's error


def chain_of(failed: FailedCompile) -> tuple[str, ...]:
    return tuple(signatures.describe_chain(signatures.exception_chain(failed.error)))


# The backends a spec could not name that this process has said so about already.
_UNNAMED_BACKENDS_SAID: set[str] = set()


def spec_for(failed: FailedCompile, spec: JobSpec | dict[str, Any] | None = None) -> JobSpec:
    """The recorded backend, config and failure, under what `spec` says explicitly."""
    given = _given(spec)
    failure = {"kind": failed.kind, "signature": signature_of(failed), **dict(given.get("failure") or {})}
    data: dict[str, Any] = {**given, "failure": failure,
                            "config": {**changed_config(failed.config), **dict(given.get("config") or {})}}
    data.setdefault("backend", failed.backend)
    if failed.autocast is not None:
        data.setdefault("autocast", failed.autocast)
    data.setdefault("op_modules", op_modules(failed.program if failed.program is not None else failed.graph))
    if "device" not in data and on_cuda(failed.inputs or _program_inputs(failed)):
        data["device"] = "cuda"
    try:
        return JobSpec.model_validate(data)
    except ValidationError as error:
        if data["backend"] == failed.backend and "backend" not in given:
            # A backend this client's spec cannot name (a local function): keep the default and say so,
            # once a process (a pending capture is written before each compile and first run).
            if failed.backend not in _UNNAMED_BACKENDS_SAID:
                _UNNAMED_BACKENDS_SAID.add(failed.backend)
                logger.warning("minify: backend %r cannot go in a job spec (%s); the spec names inductor, "
                               "edit it before submitting", failed.backend, error.errors()[0]["msg"])
            return JobSpec.model_validate({**data, "backend": "inductor"})
        raise


def _given(spec: JobSpec | dict[str, Any] | None) -> dict[str, Any]:
    """The fields `spec` sets explicitly."""
    return spec.model_dump(exclude_unset=True) if isinstance(spec, JobSpec) else dict(spec or {})


def exported(failed: FailedCompile, spec: JobSpec | dict[str, Any] | None = None) -> Program:
    """Export the failing graph (or take the failing ExportedProgram) with its inputs and spec."""
    import torch

    if failed.program is not None:
        args, kwargs = failed.program.example_inputs or ((), {})
        return Program(failed.program, tuple(args), dict(kwargs), spec_for(failed, spec), chain_of(failed))
    if needs_training(failed):  # it fails where a compile for training traces the joint graph
        given = _given(spec)
        spec = {**given, "failure": {"training": True, **dict(given.get("failure") or {})}}
        if autograd_functions(failed.graph):  # whose backward torch.export would drop
            return _with_functions_kept(failed, spec)
    module, inputs, symbolic = specialize_floats(failed.graph, failed.inputs, failed.symbolic)
    static_reason = None
    transforms = transform_calls(module.graph)
    if transforms:
        try:
            module = lower(module, inputs, grad_enabled=failed.grad_enabled)
        except Exception as error:
            raise export_refused(error, [], transforms) from error
        if is_symbolic(symbolic):
            static_reason = "a graph of torch.func transforms is captured lowered to aten ops, with static shapes"
            add_note(failed.error, f"minify: captured with static shapes: {static_reason}")
        symbolic = []
    module = for_export(module)
    if is_symbolic(symbolic):
        try:
            dynamic = export_dynamic(module, inputs, symbolic)
            return Program(dynamic.program, dynamic.inputs, {}, spec_for(failed, spec), chain_of(failed))
        except Exception as error:  # the static export below still captures the failure
            static_reason = _first_line(error)
            logger.warning("minify: the failing graph was compiled with dynamic shapes, but exporting it with "
                           "them failed (%s); it is captured with static shapes", static_reason)
            add_note(failed.error, f"minify: captured with static shapes, the dynamic export failed: {static_reason}")
    try:
        program = torch.export.export(module, inputs, strict=False)
    except Exception as error:
        ops = higher_order_ops(module.graph)
        if ops or transforms:
            raise export_refused(error, ops, transforms) from error
        raise
    if static_reason is not None:  # the job compiles what the program now is
        spec = {"dynamic": "static", **_given(spec)}
    return Program(program, inputs, {}, spec_for(failed, spec), chain_of(failed), static_reason)


def _with_functions_kept(failed: FailedCompile, spec: dict[str, Any]) -> Program:
    """The failing graph lowered with its custom autograd.Functions kept, forward and backward
    (`autograd_functions.lower`), as program.json; `CaptureRefused` saying why where it cannot be."""
    module, inputs, symbolic = specialize_floats(failed.graph, failed.inputs, failed.symbolic)
    try:
        lowered = lower_keeping_functions(module, inputs)
    except Exception as error:
        raise CaptureRefused(unreproducible(failed, root_cause(error))) from error
    static_reason = None
    if is_symbolic(symbolic):
        static_reason = "a graph holding custom autograd.Functions is captured lowered to aten ops, with static shapes"
        add_note(failed.error, f"minify: captured with static shapes: {static_reason}")
        spec = {"dynamic": "static", **spec}
    functions = autograd_functions(failed.graph)
    why = (f"torch.export keeps the forward only of the custom autograd.Function{'s' if len(functions) > 1 else ''} "
           f"({', '.join(functions)}) whose backward the failing training compile traced")
    return Program(GraphProgram(lowered, why), tuple(inputs), {}, spec_for(failed, spec), chain_of(failed),
                   static_reason)


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def _program_inputs(failed: FailedCompile) -> list[Any]:
    if failed.program is None or failed.program.example_inputs is None:
        return []
    args, kwargs = failed.program.example_inputs
    return [*args, *kwargs.values()]


def capture_key(failed: FailedCompile) -> str:
    """Which failing calls a capture run saves once (16 hex digits, kept in captures.json): two calls
    with the same graph structure (names aside), inputs' metadata, backend, settings and signature.
    Not the bug's key (minify_contract.bugs.bug_key), which groups minimized graphs across jobs."""
    graph = failed.program.graph if failed.program is not None else failed.graph.graph
    inputs = failed.inputs or _program_inputs(failed)
    text = json.dumps({
        "level": failed.level, "backward": failed.is_backward, "kind": failed.kind, "backend": failed.backend,
        "signature": signature_of(failed), "config": changed_config(failed.config),
        "graph": structure(graph), "inputs": [_metadata(value) for value in inputs],
    }, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def structure(graph: Any) -> list[str]:
    """One line per node, nodes by position instead of name, so renamed copies compare equal. Not
    the worker's graph hashes (minify_worker.programs.fx.graph): a graph as dynamo hands it over has methods and
    Python functions as targets, which those refuse, and the client never imports the worker."""
    index: dict[Any, int] = {}
    lines = []
    for position, node in enumerate(graph.nodes):
        index[node] = position
        target = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", repr(node.target))
        if node.op == "placeholder":
            target = ""
        lines.append(f"{node.op} {target} {_text(node.args, index)} {_text(node.kwargs, index)}")
    return lines


def _text(value: Any, index: dict[Any, int]) -> str:
    import torch.fx as fx

    if isinstance(value, fx.Node):
        return f"%{index.get(value, -1)}"
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(_text(item, index) for item in value) + ")"
    if isinstance(value, dict):
        return "{" + ",".join(f"{key!r}:{_text(item, index)}" for key, item in value.items()) + "}"
    return repr(value)


def _metadata(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return [list(value.shape), list(value.stride()), str(value.dtype), value.device.type]
    return repr(value)
