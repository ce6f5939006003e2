"""`torch.export.load` for programs as users save them: an adapter over torch's loader.

Checked on torch 2.13.0 (`torch/export/__init__.py`, `torch/export/pt2_archive/_package.py`,
`torch/_export/serde/serialize.py`, `torch/utils/_pytree.py`). What it adds to `torch.export.load`:

- **Stand-ins for pytree types this process does not know.** A program's input and output specs
  (`models/<name>.json`: each module call signature's `in_spec` and `out_spec`, written by
  `pytree.treespec_dumps`) name every container type by its serialized name, e.g.
  `transformers.modeling_outputs.BaseModelOutputWithPastAndCrossAttentions` or a dataclass the user
  registered with `torch.export.register_dataclass`. torch refuses the whole archive when one of
  them is not registered in the loading process (transformers registers its output types only as
  their modules are imported). The minimization runs the flat graph, never the specs, so each
  unknown name gets a stand-in type: a tuple of the node's children that keeps the serialized
  context as it was written (nothing in it is interpreted, so nothing is imported).
- **The real cause of a failure.** torch logs what went wrong while deserializing (a warning with
  the exception) and raises a bare "We ran into an error when deserializing the saved file"; the
  records and warnings of the load are kept, and `LoadFailed` carries their causes.
- **The custom ops that do not resolve here**: those of the program's custom ops
  (`op_modules.custom_ops_of_program`, "namespace::op") that `torch.ops` lacks in this process.
"""

from __future__ import annotations

import json
import logging
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# What one cause may take of a message: torch's messages for a node repeat the whole node.
CAUSE_LIMIT = 400

# Warnings that tell of the future, not of why a load failed.
_NOT_CAUSES = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)


class LoadFailed(Exception):
    """`torch.export.load` failed: `causes` says why, torch's logged causes first, then what it
    raised; `missing_ops` lists the custom ops the program calls that are not registered here."""

    def __init__(self, causes: list[str], missing_ops: list[str]) -> None:
        super().__init__("; ".join(causes))
        self.causes = causes
        self.missing_ops = missing_ops


class PytreeStandIn(tuple):
    """A node of a pytree type this process cannot name: its children, and its context as written."""

    serialized_type_name = ""
    context: Any = None


def load(path: Path) -> Any:
    """`torch.export.load(path)`, with stand-ins for the unknown pytree types its specs name;
    raises `LoadFailed` with torch's causes when it cannot load."""
    import torch

    documents = list(model_documents(path))
    for name in unknown_pytree_types(documents):
        register_stand_in(name)
    records = _Records()
    loggers = _torch_loggers()
    for logger in loggers:
        logger.addHandler(records)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                program = torch.export.load(path)
            except Exception as error:
                causes = records.causes() + [f"{w.category.__name__}: {w.message}" for w in caught
                                             if not issubclass(w.category, _NOT_CAUSES)]
                causes.append(_cause(error))
                raise LoadFailed(list(dict.fromkeys(_clip(cause) for cause in causes)),
                                 unregistered_ops(path)) from error
    finally:
        for logger in loggers:
            logger.removeHandler(records)
    for warning in caught:  # the load went through: its warnings go on as they would have
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return program


def unknown_pytree_types(documents: list[dict[str, Any]]) -> list[str]:
    """The serialized type names the documents' input and output specs use that this process has
    not registered, in order of appearance."""
    from torch.utils._pytree import SERIALIZED_TYPE_TO_PYTHON_TYPE

    names = [name for document in documents for spec in _specs(document) for name in _spec_types(spec)]
    return [name for name in dict.fromkeys(names) if name not in SERIALIZED_TYPE_TO_PYTHON_TYPE]


def register_stand_in(serialized_type_name: str) -> type[PytreeStandIn]:
    """Register a `PytreeStandIn` subclass as the pytree type named `serialized_type_name`."""
    import torch.utils._pytree as pytree

    stand_in = type(serialized_type_name.rpartition(".")[2], (PytreeStandIn,),
                    {"serialized_type_name": serialized_type_name})

    def flatten(node: PytreeStandIn) -> tuple[list[Any], Any]:
        return list(node), node.context

    def unflatten(children: Any, context: Any) -> PytreeStandIn:
        node = stand_in(children)
        node.context = context
        return node

    def as_written(context: Any) -> Any:
        return context

    pytree.register_pytree_node(stand_in, flatten, unflatten, serialized_type_name=serialized_type_name,
                                to_dumpable_context=as_written, from_dumpable_context=as_written)
    return stand_in


def unregistered_ops(path: Path) -> list[str]:
    """The custom ops ("namespace::op") the program at `path` calls that `torch.ops` lacks here."""
    import torch

    from minify_worker.programs.fx.op_modules import custom_ops_of_program

    missing = []
    for op in custom_ops_of_program(path):
        namespace, _, name = op.partition("::")
        if not hasattr(getattr(torch.ops, namespace), name):  # as torch's deserializer resolves a target
            missing.append(op)
    return missing


# ---------------------------------------------------------------------------------------------
# The archive's documents


def model_documents(path: Path) -> Iterator[dict[str, Any]]:
    """The serialized programs (`<archive>/models/<name>.json`) in the .pt2 at `path`, parsed (JSON:
    nothing is loaded or run). One that cannot be read is skipped, and nothing comes of a file that
    is not a zip: torch's own load then says what is wrong with it. Torch-free."""
    try:
        with zipfile.ZipFile(path) as archive:
            for name in archive.namelist():
                if "/models/" in f"/{name}" and name.endswith(".json"):
                    try:
                        document = json.loads(archive.read(name))
                    except (ValueError, zipfile.BadZipFile, OSError):
                        continue
                    if isinstance(document, dict):
                        yield document
    except (zipfile.BadZipFile, OSError, ValueError):
        return


def _specs(document: dict[str, Any]) -> Iterator[Any]:
    """The parsed in and out specs of every module call signature (protocol 1: `[1, schema]`)."""
    module = document.get("graph_module")
    entries = module.get("module_call_graph") if isinstance(module, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        signature = entry.get("signature") if isinstance(entry, dict) else None
        for key in ("in_spec", "out_spec"):
            text = signature.get(key) if isinstance(signature, dict) else None
            if isinstance(text, str):
                try:
                    yield json.loads(text)
                except ValueError:
                    continue


def _spec_types(value: Any) -> Iterator[str]:
    """The `type` of every node of a serialized tree spec (schema dicts nested in lists)."""
    if isinstance(value, dict):
        if isinstance(value.get("type"), str):
            yield value["type"]
        for child in value.get("children_spec") or []:
            yield from _spec_types(child)
    elif isinstance(value, list):
        for item in value:
            yield from _spec_types(item)


# ---------------------------------------------------------------------------------------------
# torch's diagnostics


class _Records(logging.Handler):
    """The warnings torch's loggers emit: torch logs a failed deserialization with its exception."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def causes(self) -> list[str]:
        causes = []
        for record in self.records:
            error = record.exc_info[1] if record.exc_info else None
            causes.append(_cause(error) if error is not None else record.getMessage())
        return causes


def _torch_loggers() -> list[logging.Logger]:
    """The loggers where torch's records end: "torch", and those of its loggers that pass nothing
    up (torch._logging sets up its own, "torch.export" among them, so)."""
    loggers = [logging.getLogger("torch")]
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if name.startswith("torch.") and isinstance(logger, logging.Logger) and not logger.propagate:
            loggers.append(logger)
    return loggers


def _cause(error: BaseException) -> str:
    """The innermost exception of `error`'s chain, as `Type: message`: torch wraps the cause in
    messages of its own ("Failed deserializing node ...")."""
    seen = {id(error)}
    while True:
        inner = error.__cause__ if error.__cause__ is not None else (
            None if error.__suppress_context__ else error.__context__)
        if inner is None or id(inner) in seen:
            break
        error = inner
        seen.add(id(inner))
    return f"{type(error).__name__}: {error}"


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= CAUSE_LIMIT else text[: CAUSE_LIMIT - 1] + "…"
