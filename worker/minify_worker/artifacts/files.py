"""The files a job delivers, and writing them: minimized.pt2, inputs.pt, repro.py,
signature_rules.py (and accuracy_rules.py beside an accuracy repro) in a sandbox child
(`write_program_artifacts`: it needs the value store and torch.export); report.json and
bundle.tar.gz in the engine's process (`write_report`, `write_bundle`, `rewrite_for_culprit`). A
write the storage refuses (a full disk) is an `ArtifactWriteError`, and leaves no partial file.
"""

from __future__ import annotations

import errno
import gzip
import io
import tarfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from minify_client.models import JobSpec, Report

from ..backends import as_torch_functions, dynamic_shapes_of, export_dynamic_shapes, uses_torch_functions
from ..graph import META_NARROW, META_VALUE, graph_from_wire, placeholders, to_graph_module
from ..outcomes import Signature, signature_from_dict
from ..shrink import narrowed
from .repro import (
    ACCURACY_RULES_MODULE,
    SIGNATURE_RULES_MODULE,
    accuracy_rules_module,
    render_repro,
    signature_rules_module,
)

MINIMIZED = "minimized.pt2"
INPUTS = "inputs.pt"
REPRO = "repro.py"
SIGNATURE_RULES = f"{SIGNATURE_RULES_MODULE}.py"  # imported by repro.py where it is beside it
ACCURACY_RULES = f"{ACCURACY_RULES_MODULE}.py"  # beside an accuracy repro.py, which judges by it
REPORT = "report.json"
BUNDLE = "bundle.tar.gz"
BUNDLE_FOLDER = "minify-repro"

InputValue = torch.Tensor | int | float | bool

# What a full disk looks like to a write: no space left, a quota, or a file over the size limit
# (RLIMIT_FSIZE, a filesystem's largest file).
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class ArtifactWriteError(Exception):
    """The storage refused an artifact (disk full, quota, file too large): the job cannot deliver it."""

    def __init__(self, name: str, cause: OSError) -> None:
        super().__init__(f"could not write {name}: {cause.strerror or cause} (errno {cause.errno}); "
                         "the disk that holds the results is full or refuses a file this large")
        self.name = name


def _write_artifact(path: Path, write: Callable[[Path], object]) -> None:
    """`write(path)`; when the storage refuses it, the partial file is removed and ArtifactWriteError raised."""
    try:
        write(path)
    except OSError as error:
        if error.errno not in STORAGE_ERRNOS:
            raise
        path.unlink(missing_ok=True)
        raise ArtifactWriteError(path.name, error) from error


def _saved(save: Callable[[Any, io.BytesIO], object], value: Any) -> Callable[[Path], object]:
    """Serialize `value` with `save` (torch.save, torch.export.save) now; the result writes the bytes.

    torch's writers report a failed write as a RuntimeError of their own; a plain write of their
    bytes fails with the OSError (ENOSPC, EFBIG) that says the disk is full.
    """
    buffer = io.BytesIO()
    save(value, buffer)
    return lambda path: path.write_bytes(buffer.getbuffer())


def raise_storage_error(result: Mapping[str, Any]) -> None:
    """Raise the ArtifactWriteError a `write_program_artifacts` child met, if it met one."""
    if result.get("storage_error"):
        name, cause = result["storage_error"]
        raise ArtifactWriteError(name, OSError(cause[0], cause[1]))


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
) -> dict[str, Any]:
    """Write minimized.pt2, inputs.pt and repro.py for the minimized graph: a `SandboxPool.call` target.

    `context.values` is the value store the sandbox child holds; `wire_graph` is `graph_to_wire`'s
    form, `spec_json` the JobSpec as JSON, `signature` the target `Signature` as a dict (asdict),
    `environment` the worker's (`environment.collect`), for repro.py's header, as are
    `culprit_lines` (the culprit phase's finding: `culprit.header_lines`).
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
        return write_program_files(graph, context.values, Path(out_dir), spec, target, environment, culprit_lines)
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
) -> dict[str, Any]:
    """`write_program_artifacts` over an in-memory graph and value store."""
    out_dir.mkdir(parents=True, exist_ok=True)
    inputs = graph_inputs(graph, values)
    files: list[str] = []
    errors: dict[str, str] = {}

    _write_artifact(out_dir / INPUTS, _saved(torch.save, inputs))
    files.append(INPUTS)
    # A registered backend receives candidates as dynamo's form (torch functions): so does the repro's.
    shown = as_torch_functions(to_graph_module(graph), inputs).graph if uses_torch_functions(spec.backend) else graph
    repro = render_repro(shown, spec, signature, torch.__version__, environment, culprit_lines, inputs=inputs)
    _write_artifact(out_dir / REPRO, lambda path: path.write_text(repro))
    files.append(REPRO)
    rules = signature_rules_module()
    _write_artifact(out_dir / SIGNATURE_RULES, lambda path: path.write_text(rules))
    files.append(SIGNATURE_RULES)
    if (signature.kind if signature is not None else spec.failure.kind) == "accuracy":
        accuracy_rules = accuracy_rules_module()
        _write_artifact(out_dir / ACCURACY_RULES, lambda path: path.write_text(accuracy_rules))
        files.append(ACCURACY_RULES)
    try:
        program = export_minimized(graph, inputs, spec.device, dynamic=spec.dynamic)
        write_minimized = _saved(torch.export.save, program)
    except Exception as error:  # a user program can fail to export in any way; report, don't die
        errors[MINIMIZED] = f"{type(error).__name__}: {error}"
    else:
        _write_artifact(out_dir / MINIMIZED, write_minimized)
        files.append(MINIMIZED)
    return {"files": files, "errors": errors}


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
    module = to_graph_module(graph)
    args = tuple(_to_device(value, device) for value in inputs)
    shapes = export_dynamic_shapes(dynamic_shapes_of(graph, dynamic))
    with torch.no_grad():
        return torch.export.export(module, args, dynamic_shapes=shapes)


def _to_device(value: InputValue, device: str) -> InputValue:
    return value.to(device) if isinstance(value, torch.Tensor) else value


# ---------------------------------------------------------------------------------------------
# In the engine: report.json, bundle.tar.gz


def write_report(report: Report, out_dir: Path) -> Path:
    """report.json: the Report model as JSON."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / REPORT
    text = report.model_dump_json(indent=2) + "\n"
    _write_artifact(path, lambda target: target.write_text(text))
    return path


def write_bundle(out_dir: Path) -> Path:
    """bundle.tar.gz of the artifacts present in `out_dir`, under one folder.

    Deterministic (sorted, fixed mtimes and owners): the same artifacts give the same bytes.
    """
    path = out_dir / BUNDLE
    data = _bundle_bytes(out_dir)
    _write_artifact(path, lambda target: target.write_bytes(data))
    return path


def _bundle_bytes(out_dir: Path) -> bytes:
    names = [name for name in (MINIMIZED, INPUTS, REPRO, SIGNATURE_RULES, ACCURACY_RULES, REPORT)
             if (out_dir / name).is_file()]
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0) as compressed, \
            tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name in sorted(names):
            data = (out_dir / name).read_bytes()
            info = tarfile.TarInfo(f"{BUNDLE_FOLDER}/{name}")
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def rewrite_for_culprit(out_dir: Path, report: Report, pending_lines: list[str], final_lines: list[str]) -> None:
    """After the culprit phase, which runs once the result is delivered: report.json, repro.py's
    header (`pending_lines` replaced by `final_lines`) and the bundle, each replaced whole by a
    rename, so a download meanwhile gets the delivered file or the new one, never half of one."""
    repro = out_dir / REPRO
    if repro.is_file() and pending_lines:
        text = repro.read_text()
        _replace_whole(repro, text.replace(_commented(pending_lines), _commented(final_lines), 1).encode())
    _replace_report_and_bundle(out_dir, report)


# Lines added to repro.py's header after delivery go before the first of these paragraphs (repro.py's _header).
_LATE_HEADER_ANCHORS = ("# Environment it failed in", "# Run: python repro.py")


def rewrite_with_header_lines(out_dir: Path, report: Report, lines: list[str]) -> None:
    """After the version phase, which also follows the delivered result: `lines` added to repro.py's
    header as a paragraph of their own (before the environment's), then report.json and the bundle,
    each replaced whole by a rename as `rewrite_for_culprit` replaces them."""
    repro = out_dir / REPRO
    if repro.is_file() and lines:
        text = repro.read_text()
        for anchor in _LATE_HEADER_ANCHORS:
            at = text.find("\n" + anchor)
            if at >= 0:
                text = text[:at + 1] + _commented(lines) + "\n#\n" + text[at + 1:]
                break
        _replace_whole(repro, text.encode())
    _replace_report_and_bundle(out_dir, report)


def _replace_report_and_bundle(out_dir: Path, report: Report) -> None:
    _replace_whole(out_dir / REPORT, (report.model_dump_json(indent=2) + "\n").encode())
    if (out_dir / BUNDLE).is_file():
        _replace_whole(out_dir / BUNDLE, _bundle_bytes(out_dir))


def _commented(lines: list[str]) -> str:
    return "\n".join(f"# {line}".rstrip() for line in lines)


def _replace_whole(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.new")
    _write_artifact(temporary, lambda target: target.write_bytes(data))
    temporary.replace(path)
