"""Prepare a user's program for minimization: the flat graph and its value store (docs/internals.md).

Runs in a sandbox child only (`prepare_in_child`, a `SandboxPool.call` target; the parent calls
`sandbox.prepare_program`): loading a user's file is the first thing that may crash.

Accepted programs:
- a `.pt2` written by `torch.export.save`; one with members that run code when loaded (pickled
  weights or constants, see `minify_contract.archive`) only when `MINIFY_ALLOW_PICKLE=1`: the check
  runs here, before `torch.export.load`, whatever the server decided;
- a pickled `torch.fx.GraphModule` written by `torch.save(gm)`, only when `MINIFY_ALLOW_PICKLE=1`
  (a pickle runs code when loaded): it is re-exported with `torch.export.export(gm, args)`;
- minify's program.json (`minify_contract.program_json`, program_format fx_json), what a capture
  writes where torch.export.save cannot: the graph as the wire form, read from allowlists only
  (`prepare_program_json`), its inputs file holding every placeholder's value.

Inputs (`--inputs FILE.pt`, read with `torch.load(weights_only=True)`), in the program's calling
convention, one of:
- `(args, kwargs)`: a pair of a tuple/list of positional arguments and a dict of keyword ones;
- a tuple or list: the positional arguments;
- a dict: the keyword arguments (or, if that does not fit the program, its one positional dict);
- a single tensor: the only positional argument.
A ZeroTensor, which torch.save refuses, is in the file as the marker `minify_contract.zero_tensors`
writes (a plain dict) and is rebuilt as one. The first reading whose structure fits the program's
input spec is used. Without an inputs file:
the program's own `example_inputs` (torch.export.save keeps them), else inputs made from the
placeholders' metadata (randn for floating point, randint(0, 2) for integers, zeros for bool).
An input the program was exported with as a constant (a number, bool, string or None given to
`torch.export.export`: the graph signature holds its value) must be given that value; export baked
it into the graph, and its placeholder, which nothing uses, is left out of the flat graph.

A program whose graph calls custom ops (`torch.library`) loads only where they are registered: the
job spec names the modules that register them (`op_modules`, a capture fills it in), and the
worker imports those its operator allows (`MINIFY_ALLOWED_OP_MODULES`, comma-separated module
prefixes); otherwise the load fails naming the missing ops and these two names.

Outputs, in the work dir: `values.pt` (`dict[str, Tensor | int | float | bool]`: every input by
placeholder name, every promotable intermediate by node name, from one eager run, on the CPU; a
ZeroTensor, in the inputs file and here, as the marker `minify_contract.zero_tensors` reads back)
and `program.json` (`{"format", "graph": wire form, "metadata": {...}}`).
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any

from minify_contract import zero_tensors
from minify_contract.accuracy import clone_input
from minify_contract.archive import (
    ALLOW_PICKLE_ENV,
    describe_not_a_zip,
    describe_unsafe_members,
    find_unsafe_members,
)
from minify_worker.programs.fx import export_load
from minify_worker.programs.fx.op_modules import ALLOWED_OP_MODULES_ENV
from minify_worker.programs.prepared import FORMAT, PROGRAM_JSON, VALUES, ProgramError

EXPORT_HINT = (
    "export it instead: ep = torch.export.export(model, args, kwargs); torch.export.save(ep, 'program.pt2')"
)


# ---------------------------------------------------------------------------------------------
# Entry points (in the child)


def prepare_in_child(context: Any, *, program: str, inputs: str | None = None) -> dict[str, Any]:
    """`SandboxPool.call` target: `prepare` into the pool's work dir on the spec's device."""
    return prepare(Path(program), None if inputs is None else Path(inputs), Path(context.workdir),
                   device=context.spec.device, eager_may_fail=context.spec.failure.kind in ("accuracy", "crash"))


def prepare(program: Path, inputs: Path | None, workdir: Path, device: str = "cpu",
            eager_may_fail: bool = False) -> dict[str, Any]:
    """Load `program` (and `inputs`), write values.pt and program.json into `workdir`; returns the metadata.
    `eager_may_fail`: an accuracy job's program may raise eagerly (its failure may be a MissingError:
    eager raises, compiled returns), and so may a crash job's (eager raises, the compiled program
    kills the process: a check the compiled code turned into a crash); the values recorded up to the
    failing op are kept. The runner refuses a candidate that raises both ways (the program's own
    error)."""
    from minify_worker.programs.fx.graph import flat_graph_from_exported_program

    if is_program_json(program):
        return prepare_program_json(program, inputs, workdir, device, eager_may_fail)
    raw_inputs = read_inputs(inputs) if inputs is not None else None
    ep, source = load_program(program, raw_inputs)
    flat_inputs = user_inputs(ep, raw_inputs)
    try:
        graph = flat_graph_from_exported_program(ep)
    except ValueError as error:
        raise ProgramError(f"the program uses something minify cannot handle: {error}") from error
    values = placeholder_values(ep, graph, flat_inputs)
    _record_values(graph, values, workdir, device, eager_may_fail)
    signature = ep.graph_signature
    metadata = {
        "source": source,
        "program": program.name,
        "user_inputs": [spec.arg.name for spec, _ in _user_input_specs(ep)],
        "parameters": list(signature.parameters),
        "buffers": list(signature.buffers),
        "constants": [s.arg.name for s in signature.input_specs if s.kind.name == "CONSTANT_TENSOR"],
        "user_outputs": [str(name) for name in signature.user_outputs],
        "in_spec": str(ep.call_spec.in_spec) if ep.call_spec.in_spec is not None else None,
        "out_spec": str(ep.call_spec.out_spec) if ep.call_spec.out_spec is not None else None,
    }
    return _write_prepared(graph, metadata, workdir, device)


def _write_prepared(graph: Any, metadata: dict[str, Any], workdir: Path, device: str) -> dict[str, Any]:
    """The prepared program (its graph and `metadata`, with what every source adds) written as the
    workdir's program.json; returns the metadata."""
    import torch

    from minify_worker.programs.fx.graph import count_ops, graph_to_wire

    metadata = {**metadata, "nodes_original": count_ops(graph), "device": device, "torch_version": torch.__version__}
    document = {"format": FORMAT, "graph": graph_to_wire(graph), "metadata": metadata}
    (workdir / PROGRAM_JSON).write_text(json.dumps(document))
    return metadata


def _record_values(graph: Any, values: dict[str, Any], workdir: Path, device: str, eager_may_fail: bool) -> None:
    """The eager run's values added to `values` (the placeholders'), the graph pointed at them, and
    values.pt written."""
    import torch

    values.update(concrete_values(graph, values, device, partial=eager_may_fail))
    _drop_missing_value_keys(graph, values)
    mark_taken_branches(graph, values)
    workdir.mkdir(parents=True, exist_ok=True)
    torch.save(zero_tensors.encode(values), workdir / VALUES)


# ---------------------------------------------------------------------------------------------
# program.json: minify's own format, for a program torch.export.save cannot write


def is_program_json(path: Path) -> bool:
    """Whether `path` is (meant as) a program.json: its first byte past white space is `{`."""
    if not path.is_file():
        return False
    with open(path, "rb") as file:
        return file.read(256).lstrip()[:1] == b"{"


def prepare_program_json(program: Path, inputs: Path | None, workdir: Path, device: str = "cpu",
                         eager_may_fail: bool = False) -> dict[str, Any]:
    """`prepare` for a program.json (`minify_contract.program_json`): the document checked again
    (whatever the server decided), its graph read with `graph_from_wire` (targets from the
    allowlist only), and every placeholder's value from `inputs`: a dict by placeholder name, or a
    tuple or list in the placeholders' order. A placeholder's role and its values' keys are the
    document's; the keys of intermediates are made afresh from this run."""
    from minify_contract.program_json import ProgramJsonError, read_document
    from minify_worker.programs.fx.graph import META_ROLE, GraphFormatError, graph_from_wire

    try:
        document = read_document(program.read_bytes())
        graph = graph_from_wire(document["graph"])
    except (ProgramJsonError, GraphFormatError) as error:
        raise ProgramError(f"{program.name} is not a program.json minify can read: {error}") from None
    if inputs is None:
        raise ProgramError(f"{program.name} is a program.json: it needs its inputs file (every placeholder's "
                           "value by name, the capture's inputs.pt)")
    _fresh_value_keys(graph)
    values = _program_json_values(graph, read_inputs(inputs), program.name)
    _record_values(graph, values, workdir, device, eager_may_fail)
    nodes = [node for node in graph.nodes if node.op == "placeholder"]
    roles = {node.name: node.meta.get(META_ROLE, "input") for node in nodes}
    metadata = {
        "source": "program.json",
        "program": program.name,
        "why_not_pt2": document.get("why"),
        "user_inputs": [name for name, role in roles.items() if role == "input"],
        "parameters": [name for name, role in roles.items() if role == "parameter"],
        "buffers": [name for name, role in roles.items() if role == "buffer"],
        "constants": [name for name, role in roles.items() if role == "constant"],
        "user_outputs": [],
        "in_spec": None,
        "out_spec": None,
    }
    return _write_prepared(graph, metadata, workdir, device)


def _fresh_value_keys(graph: Any) -> None:
    """Key every placeholder's value by its name and every promotable top-level node's by its own,
    as a graph exported afresh is (`flat_graph_from_exported_program`); a subgraph's keys, a
    shrunk input's narrowing and a taken branch are this run's to find (a minimized.json's graph
    carries those of the job that wrote it)."""
    from minify_worker.programs.fx.graph import (
        META_KIND,
        META_NARROW,
        META_TAKEN,
        META_VALUE,
        PROMOTABLE_KINDS,
        subgraph_of,
    )

    def clear(subgraph: Any) -> None:
        for node in subgraph.nodes:
            for key in (META_VALUE, META_TAKEN, META_NARROW):
                node.meta.pop(key, None)
            if node.op == "get_attr":
                clear(subgraph_of(node))

    clear(graph)
    for node in graph.nodes:
        if node.op == "placeholder" or (node.op == "call_function" and node.meta.get(META_KIND) in PROMOTABLE_KINDS):
            node.meta[META_VALUE] = node.name


def _program_json_values(graph: Any, raw: Any, program: str) -> dict[str, Any]:
    """Every placeholder's value by name from the inputs file `raw`, checked against its meta."""
    import torch

    from minify_worker.programs.fx.graph import META_TENSOR

    nodes = [node for node in graph.nodes if node.op == "placeholder"]
    if isinstance(raw, tuple | list) and len(raw) == len(nodes):
        raw = dict(zip([node.name for node in nodes], raw, strict=True))
    if not isinstance(raw, dict):
        raise ProgramError(f"the inputs of {program} must be a dict of every placeholder's value by name, or a "
                           f"tuple of {len(nodes)} values in the placeholders' order; the file holds "
                           f"{_describe_value(raw)}")
    missing = [node.name for node in nodes if node.name not in raw]
    if missing:
        raise ProgramError(f"the inputs of {program} have no value for placeholder{'s' if len(missing) > 1 else ''} "
                           f"{', '.join(missing)}")
    values: dict[str, Any] = {}
    for node in nodes:
        value, meta = raw[node.name], node.meta.get(META_TENSOR)
        where = f"placeholder {node.name!r}"
        if meta is not None:
            if not isinstance(value, torch.Tensor):
                raise ProgramError(f"{where} is a tensor {meta['shape']} {meta['dtype']}, got {_describe_value(value)}")
            if str(value.dtype).removeprefix("torch.") != meta["dtype"] or value.dim() != len(meta["shape"]):
                raise ProgramError(f"{where} is a tensor {meta['shape']} {meta['dtype']}, got {_describe_value(value)}")
            values[node.name] = value.detach().to("cpu")
        elif isinstance(value, bool | int | float):
            values[node.name] = value
        else:
            raise ProgramError(f"{where} takes a number, got {_describe_value(value)}")
    return values


# ---------------------------------------------------------------------------------------------
# Reading files


def read_inputs(path: Path) -> Any:
    import torch

    if not path.is_file():
        raise ProgramError(f"inputs file {path.name} does not exist")
    try:
        loaded = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as error:
        raise ProgramError(
            f"cannot read inputs file {path.name} with torch.load(weights_only=True): {_short(error)}; "
            "save the inputs with torch.save((args, kwargs), 'inputs.pt') using tensors, numbers, "
            "tuples, lists and dicts only"
        ) from error
    return zero_tensors.decode(loaded, device="cpu")  # a ZeroTensor input is kept as a marker


def refusal(path: Path) -> str | None:
    """Why `path` is refused, told from its bytes alone (no torch.export.load, no child): no such
    file, not a zip archive or a damaged one, an archive whose loading would run code, a pickle
    where the operator allows none, a zip that is no torch.export archive. None for an archive the
    loader may read, and for a program.json (its checks are the loader's). `load_program` refuses
    the same programs with the same words."""
    if is_program_json(path):
        return None
    try:
        _archive_kind(path)
    except ProgramError as error:
        return str(error)
    return None


def load_program(path: Path, raw_inputs: Any) -> tuple[Any, str]:
    """The ExportedProgram in `path` and its source kind ("pt2" or "pickle")."""
    if _archive_kind(path) == "pt2":
        try:
            return export_load.load(path), "pt2"
        except export_load.LoadFailed as failure:
            raise ProgramError(_load_failure(path, failure)) from failure
    return _export_pickled_module(path, raw_inputs), "pickle"


def _archive_kind(path: Path) -> str:
    """The upload's kind: "pt2", a torch.export archive that runs no code when loaded, or "pickle",
    a torch.save'd module where the operator allows pickles; anything else raises `ProgramError`."""
    if not path.is_file():
        raise ProgramError(f"program file {path.name} does not exist")
    if not zipfile.is_zipfile(path):
        raise ProgramError(
            f"{path.name} is not a torch.export archive (.pt2): {describe_not_a_zip(path)}; {EXPORT_HINT}"
        )
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError) as error:
        raise ProgramError(f"{path.name} is a damaged zip file: {_short(error)}") from error
    if any(name.endswith("archive_format") or "/models/" in name for name in names):
        _refuse_code_in_archive(path)
        return "pt2"
    if any(name.endswith("data.pkl") for name in names):
        if os.environ.get(ALLOW_PICKLE_ENV) != "1":
            raise ProgramError(
                f"{path.name} is a pickle (torch.save), which runs arbitrary code when loaded; it is refused "
                f"unless the worker's operator sets {ALLOW_PICKLE_ENV}=1. {EXPORT_HINT}"
            )
        return "pickle"
    raise ProgramError(f"{path.name} is a zip file but not a torch.export archive; {EXPORT_HINT}")


def _load_failure(path: Path, failure: export_load.LoadFailed) -> str:
    cause = "; ".join(failure.causes)
    if not failure.missing_ops:
        return f"torch.export.load could not load {path.name}: {cause}"
    return (
        f"{path.name} calls custom ops that are not registered in the worker: {', '.join(failure.missing_ops)}. "
        "To provide them, the job spec lists the Python modules that register them in 'op_modules' "
        f"(a capture fills it in), and the worker's operator allows those modules with "
        f"{ALLOWED_OP_MODULES_ENV}=<comma-separated module prefixes>. torch.export.load: {cause}"
    )


def _refuse_code_in_archive(path: Path) -> None:
    if os.environ.get(ALLOW_PICKLE_ENV) == "1":
        return
    try:
        unsafe = find_unsafe_members(path)
    except (zipfile.BadZipFile, OSError) as error:
        raise ProgramError(f"{path.name} is a damaged zip file: {_short(error)}") from error
    if unsafe:
        raise ProgramError(
            f"{path.name} is refused: {describe_unsafe_members(unsafe)}. The worker's operator allows "
            f"such archives by setting {ALLOW_PICKLE_ENV}=1 (only for uploads they trust); or save the "
            "program with plain tensors as weights and constants: torch.export.save(ep, 'program.pt2')"
        )


def _export_pickled_module(path: Path, raw_inputs: Any) -> Any:
    import torch

    try:
        module = torch.load(path, weights_only=False, map_location="cpu")
    except Exception as error:
        raise ProgramError(f"cannot unpickle {path.name}: {_short(error)}") from error
    if not isinstance(module, torch.nn.Module):
        raise ProgramError(f"{path.name} holds a {type(module).__name__}, not a torch.fx.GraphModule")
    if raw_inputs is None:
        args: tuple[Any, ...] = tuple(_inputs_from_placeholder_meta(module))
        kwargs: dict[str, Any] = {}
    else:
        args, kwargs = _positional_reading(raw_inputs)
    try:
        with torch.no_grad():
            return torch.export.export(module, args, kwargs)
    except Exception as error:
        raise ProgramError(f"cannot torch.export the pickled module with its inputs: {_short(error)}") from error


def _positional_reading(raw: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    for args, kwargs in _readings(raw):
        return args, kwargs
    raise ProgramError(f"inputs must be (args, kwargs), a tuple, a list, a dict or a tensor, not {type(raw).__name__}")


def _inputs_from_placeholder_meta(module: Any) -> list[Any]:
    values = []
    for node in module.graph.nodes:
        if node.op != "placeholder":
            continue
        meta = node.meta.get("val", node.meta.get("example_value"))
        if meta is None:
            raise ProgramError(
                f"the pickled module's input {node.name!r} has no recorded shape: pass an inputs file"
            )
        values.append(make_value(meta))
    return values


# ---------------------------------------------------------------------------------------------
# Inputs


def _readings(raw: Any) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """The ways `raw` can be read as (args, kwargs), most specific first."""
    import torch

    readings: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    if isinstance(raw, torch.Tensor):
        readings.append(((raw,), {}))
    if isinstance(raw, tuple | list):
        if len(raw) == 2 and isinstance(raw[0], tuple | list) and isinstance(raw[1], dict):
            readings.append((tuple(raw[0]), dict(raw[1])))
        readings.append((tuple(raw), {}))
    if isinstance(raw, dict):
        readings.append(((), dict(raw)))
        readings.append(((raw,), {}))
    return readings


def user_inputs(ep: Any, raw_inputs: Any) -> list[Any]:
    """The user inputs, flattened in the order of the user-input placeholders, checked against them."""
    expected = _user_input_specs(ep)
    if raw_inputs is None:
        example = getattr(ep, "example_inputs", None)
        if example is not None:
            flat = _flatten_for(ep, *example)
            if flat is not None:
                return flat
        return [_constant(spec) if _is_constant(spec) else make_value(node.meta.get("val"))
                for spec, node in expected]
    for args, kwargs in _readings(raw_inputs):
        flat = _flatten_for(ep, args, kwargs)
        if flat is not None:
            check_inputs(expected, flat)
            return flat
    raise ProgramError(
        f"the inputs do not fit the program: it takes {_describe_spec(ep)}, the file holds "
        f"{_describe_value(raw_inputs)}; save them as torch.save((args, kwargs), 'inputs.pt')"
    )


def _user_input_specs(ep: Any) -> list[tuple[Any, Any]]:
    """Each user input's spec and placeholder, in the order of the flat inputs. The graph's
    placeholders follow the signature's input specs (torch's own input check pairs them so); a
    constant input's spec holds its value where the signature's `user_inputs` would have its name."""
    from torch.export.graph_signature import InputKind

    placeholder_nodes = [node for node in ep.graph.nodes if node.op == "placeholder"]
    return [(spec, node) for spec, node in zip(ep.graph_signature.input_specs, placeholder_nodes, strict=True)
            if spec.kind == InputKind.USER_INPUT]


def _is_constant(spec: Any) -> bool:
    from torch.export.graph_signature import ConstantArgument

    return isinstance(spec.arg, ConstantArgument)


def _constant(spec: Any) -> Any:
    return spec.arg.value


def _flatten_for(ep: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any] | None:
    """`(args, kwargs)` flattened by the program's input spec, or None when the structure differs."""
    from torch.fx._pytree import tree_flatten_spec
    from torch.utils._pytree import tree_flatten

    in_spec = ep.call_spec.in_spec
    if in_spec is None:
        flat = list(args)
    else:
        try:
            flat = list(tree_flatten_spec((tuple(args), dict(kwargs)), in_spec))
        except Exception:
            return None
        if len(tree_flatten((tuple(args), dict(kwargs)))[0]) != in_spec.num_leaves:
            return None
    return flat if len(flat) == len(_user_input_specs(ep)) else None


def check_inputs(expected: list[tuple[Any, Any]], given: list[Any]) -> None:
    """Raise a `ProgramError` naming the first input whose kind, dtype, shape or constant value
    differs; `expected` is `_user_input_specs`."""
    import torch

    for position, ((spec, node), value) in enumerate(zip(expected, given, strict=True)):
        meta = node.meta.get("val")
        where = f"input {position} ({spec.arg.name!r})"
        if _is_constant(spec):
            if isinstance(value, torch.Tensor) or value != _constant(spec):
                raise ProgramError(f"{where} was exported as the constant {_constant(spec)!r}, which the program "
                                   f"is fixed to; got {_describe_constant(value)}")
        elif isinstance(meta, torch.Tensor):
            if not isinstance(value, torch.Tensor):
                raise ProgramError(f"{where} must be a tensor {_describe_value(meta)}, got {_describe_value(value)}")
            if value.dtype != meta.dtype:
                raise ProgramError(f"{where} must have dtype {meta.dtype}, got {value.dtype}")
            if value.dim() != meta.dim():
                raise ProgramError(f"{where} must have shape {_shape(meta)}, got {list(value.shape)}")
            for axis, (want, got) in enumerate(zip(meta.shape, value.shape, strict=True)):
                if isinstance(want, int) and want != got:
                    raise ProgramError(f"{where} must have shape {_shape(meta)}, got {list(value.shape)} "
                                       f"(dimension {axis})")
        elif isinstance(value, torch.Tensor) and meta is not None:
            raise ProgramError(f"{where} must be a {type(meta).__name__}, got a tensor")


def make_value(meta: Any) -> Any:
    """An input value for a placeholder from its `val` metadata (a fake tensor or a number)."""
    import torch

    if isinstance(meta, torch.Tensor):
        shape = [_hint(size) for size in meta.shape]
        if meta.dtype == torch.bool:
            return torch.zeros(shape, dtype=torch.bool)
        if meta.dtype.is_floating_point or meta.dtype.is_complex:
            return torch.randn(shape, dtype=meta.dtype)
        return torch.randint(0, 2, shape, dtype=meta.dtype)
    if isinstance(meta, torch.SymInt | torch.SymFloat | torch.SymBool):
        return _hint(meta)
    if isinstance(meta, bool | int | float):
        return meta
    raise ProgramError(f"cannot make an input from metadata {meta!r}: pass an inputs file")


def _hint(value: Any) -> Any:
    import torch

    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        hint = getattr(value.node, "hint", None)
        if hint is None:
            raise ProgramError(f"input size {value} has no example value: pass an inputs file")
        return hint
    return int(value)


# ---------------------------------------------------------------------------------------------
# The value store


def placeholder_values(ep: Any, graph: Any, flat_inputs: list[Any]) -> dict[str, Any]:
    """Every placeholder's value by its name in `graph` (the flat copy of `ep`, which may have
    renamed one): user inputs in order, parameters, buffers and constants from the program's state
    by the graph signature. A constant input that nothing uses is removed from `graph`: export
    baked its value into the ops, and a compiler given the user's program never sees it."""
    import torch
    from torch.export.graph_signature import InputKind

    from minify_worker.programs.fx.graph import placeholders

    given = iter(flat_inputs)
    values: dict[str, Any] = {}
    for spec, node in zip(ep.graph_signature.input_specs, placeholders(graph), strict=True):
        if spec.kind == InputKind.USER_INPUT:
            value = next(given)
            if _is_constant(spec) and not node.users:
                graph.erase_node(node)
                continue
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            if spec.target in ep.state_dict:
                value = ep.state_dict[spec.target]
            elif spec.target in ep.constants:
                value = ep.constants[spec.target]
            else:
                raise ProgramError(f"the program has no value for {spec.kind.name.lower()} {spec.target!r}")
        else:
            raise ProgramError(f"input {spec.arg.name!r} is a {spec.kind.name.lower()}, "
                               "which minify does not support")
        if isinstance(value, torch.Tensor):
            values[node.name] = value.detach().to("cpu")
        elif isinstance(value, bool | int | float):
            values[node.name] = value
        else:
            raise ProgramError(f"input {spec.arg.name!r} is a {type(value).__name__}; "
                               "only tensors and numbers are supported")
    return values


def concrete_values(graph: Any, inputs: dict[str, Any], device: str, partial: bool = False) -> dict[str, Any]:
    """The value of every tensor- or number-valued node, from one eager run (torch's ConcreteProp).

    A `torch.cond` runs the branch its predicate picks, recorded the same way: the values of that
    branch's nodes are keyed `"<cond node>/<node>"` (nested conds extend the path), and
    `mark_taken_branches` points the graph at them.
    """
    import torch

    from minify_worker.programs.fx.graph import is_mutating, to_graph_module

    gm = to_graph_module(graph)
    args = [_to_device(inputs[node.name], device) for node in gm.graph.nodes if node.op == "placeholder"]
    if any(is_mutating(node) for node in gm.graph.nodes):
        # torch.export keeps in-place ops (an input's `mul_`, a buffer's `add_`, an optimizer's
        # step on the weights): the run gets copies, so that `inputs` stay what the program received.
        args = [clone_input(arg) if isinstance(arg, torch.Tensor) else arg for arg in args]
    recorded: dict[str, Any] = {}
    try:
        with torch.no_grad():
            _recorder(gm, "", recorded).run(*args)
    except Exception as error:
        if not partial:
            raise ProgramError(f"the program fails when run eagerly on its inputs: {_short(error)}") from error
    return recorded


def _recorder(module: Any, prefix: str, recorded: dict[str, Any]) -> Any:
    """An fx.Interpreter over `module` that records values under `prefix + node name`."""
    import torch
    from torch import fx

    class Recorder(fx.Interpreter):
        def run_node(self, node: fx.Node) -> Any:
            if node.op == "call_function" and node.target is torch.ops.higher_order.cond:
                predicate, true_branch, false_branch, operands = self.fetch_args_kwargs_from_env(node)[0]
                branch = true_branch if bool(predicate) else false_branch
                result = _recorder(branch, f"{prefix}{node.name}/", recorded).run(*operands)
            else:
                result = super().run_node(node)
            if node.op == "call_function":
                if isinstance(result, torch.Tensor) and result.device.type != "meta":  # no data to keep
                    # A ZeroTensor, a conjugate or negative view stays one: promoted to an input, it is
                    # what the op gave its users.
                    recorded[prefix + node.name] = clone_input(result.detach().to("cpu"))
                elif isinstance(result, bool | int | float):
                    recorded[prefix + node.name] = result
            return result

    return Recorder(module)


def mark_taken_branches(graph: Any, values: dict[str, Any], prefix: str = "") -> None:
    """Record on each `torch.cond` which branch the original run took (`minify_taken`: the position
    of its subgraph among the cond's arguments, 1 or 2), and give that branch's nodes the keys of
    their recorded values (`minify_value`), so that inlining the branch keeps them promotable."""
    import torch
    from torch import fx

    from minify_worker.programs.fx.graph import META_KIND, META_TAKEN, META_VALUE, PROMOTABLE_KINDS, subgraph_of

    for node in graph.nodes:
        if prefix and node.op == "call_function" and node.meta.get(META_KIND) in PROMOTABLE_KINDS \
                and prefix + node.name in values:
            node.meta[META_VALUE] = prefix + node.name
        if node.op != "call_function" or node.target is not torch.ops.higher_order.cond:
            continue
        predicate = node.args[0]
        if isinstance(predicate, fx.Node):
            predicate = values.get(prefix + predicate.name if prefix else predicate.meta.get(META_VALUE, ""))
        if predicate is None:
            continue
        taken = 1 if bool(predicate) else 2
        node.meta[META_TAKEN] = taken
        if len(node.args[taken].users) == 1:  # a subgraph shared by several ops has no single run
            mark_taken_branches(subgraph_of(node.args[taken]), values, f"{prefix}{node.name}/")


def _drop_missing_value_keys(graph: Any, values: dict[str, Any]) -> None:
    from minify_worker.programs.fx.graph import META_VALUE

    for node in graph.nodes:
        if node.meta.get(META_VALUE) is not None and node.meta[META_VALUE] not in values:
            del node.meta[META_VALUE]


def _to_device(value: Any, device: str) -> Any:
    import torch

    return zero_tensors.to_device(value, device) if isinstance(value, torch.Tensor) else value


# ---------------------------------------------------------------------------------------------
# Messages


def _short(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:500]


def _shape(meta: Any) -> list[Any]:
    return [size if isinstance(size, int) else str(size) for size in meta.shape]


def _describe_value(value: Any) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return f"tensor{_shape(value)} {str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, tuple | list):
        inner = ", ".join(_describe_value(item) for item in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key!r}: {_describe_value(item)}" for key, item in value.items()) + "}"
    return type(value).__name__


def _describe_constant(value: Any) -> str:
    """A number, bool, string or None as written; anything else by its kind and shape."""
    return repr(value) if value is None or isinstance(value, bool | int | float | str) else _describe_value(value)


def _describe_spec(ep: Any) -> str:
    specs = _user_input_specs(ep)
    flat = ", ".join(
        f"{spec.arg.name}: " + (f"the constant {_constant(spec)!r}" if _is_constant(spec)
                                else _describe_value(node.meta.get("val")))
        for spec, node in specs)
    return f"{len(specs)} inputs ({flat}) structured as {ep.call_spec.in_spec}"
