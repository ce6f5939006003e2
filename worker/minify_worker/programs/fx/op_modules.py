"""The modules that register a program's custom ops, imported where the worker's operator allows them.

A program that calls custom ops (`torch.ops.<ns>.<op>` outside torch's own namespaces, registered
by `torch.library.custom_op`, a `Library` and its kernels, or a C++ extension) loads only in a
process that registered them, by importing the Python module that does: the job spec names those
modules (`op_modules`; a capture records them, `minify_client.capture.custom_ops`). As for custom
backends (`MINIFY_ALLOWED_BACKENDS`), the worker imports only what its operator allows: modules
named by, or under, one of the comma-separated prefixes in `MINIFY_ALLOWED_OP_MODULES`.

They are imported twice, and nowhere else: in the engine's process before it rebuilds the prepared
graph, whose call targets are these ops (`sandbox.prepare_program`, where a module that is not
allowed or does not import fails the job at once, naming it and the program's custom ops); and in
the fork server before it forks anything (`sandbox/server.py`), so that every sandbox child (the
one that prepares the program, candidates forked or long-lived, the culprit phase's probes, the
artifacts) has them from its start without importing them again. A module that initializes CUDA
when imported is refused: every child is forked after it (docs/isolation.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from minify_client.capture.custom_ops import TORCH_NAMESPACES
from minify_worker.allowlist import allowed_prefixes
from minify_worker.programs.fx.export_load import model_documents

ALLOWED_OP_MODULES_ENV = "MINIFY_ALLOWED_OP_MODULES"


class OpModuleError(Exception):
    """A module the spec's `op_modules` names cannot be imported here: not allowed, missing, broken."""


def allowed(module: str, prefixes: Sequence[str]) -> bool:
    """Whether `module` is one of `prefixes` or a submodule of one (`pkg` allows `pkg.ops`, not `pkg_x`)."""
    return any(module == prefix or module.startswith(prefix.rstrip(".") + ".") for prefix in prefixes)


def import_op_modules(modules: Sequence[str], ops: Sequence[str] = ()) -> None:
    """Import each of `modules` (the spec's `op_modules`), or raise `OpModuleError` saying which
    module, which of the program's custom ops (`ops`, "ns::op") need it, and how to provide it."""
    import torch  # here, not at the top: a spawned fork server imports this module before it times torch's import

    needed = f"the program's custom ops ({', '.join(ops)}) need" if ops else "the job needs"
    prefixes = allowed_prefixes(ALLOWED_OP_MODULES_ENV)
    for module in modules:
        if not allowed(module, prefixes):
            raise OpModuleError(
                f"{needed} module {module!r} (spec op_modules), which this worker does not allow: its operator "
                f"allows it with {ALLOWED_OP_MODULES_ENV}={module} (comma-separated module prefixes; now "
                f"{','.join(prefixes) or 'empty'}) and installs the package that provides it on the worker"
            )
        cuda_before = torch.cuda.is_initialized()
        try:
            importlib.import_module(module)
        except Exception as error:
            raise OpModuleError(
                f"{needed} module {module!r} (spec op_modules), which cannot be imported on this worker: "
                f"{type(error).__name__}: {error}; install the package that provides it on the worker (or put "
                "it on the worker's PYTHONPATH)"
            ) from error
        if torch.cuda.is_initialized() and not cuda_before:
            raise OpModuleError(
                f"op module {module!r} (spec op_modules) initialized CUDA when imported: sandbox children are "
                "forked from the process that imports it and could not use CUDA; it must not touch the GPU at "
                "import time"
            )


def custom_ops_of_program(path: Path) -> list[str]:
    """The custom ops ("ns::op") the .pt2 at `path` calls, read from its serialized graphs
    (`export_load.model_documents`: nothing is loaded or run); [] when it is not a .pt2 that can be
    read so."""
    found: dict[str, None] = {}
    for document in model_documents(path):
        for target in _targets(document):
            namespace, _, rest = target.removeprefix("torch.ops.").partition(".")
            if namespace not in TORCH_NAMESPACES:
                found[f"{namespace}::{rest.split('.')[0]}"] = None
    return list(found)


def _targets(document: Any) -> Iterator[str]:
    """Every `"target": "torch.ops...."` in a serialized program, its subgraphs' included."""
    if isinstance(document, dict):
        target = document.get("target")
        if isinstance(target, str) and target.startswith("torch.ops."):
            yield target
        for value in document.values():
            yield from _targets(value)
    elif isinstance(document, list):
        for value in document:
            yield from _targets(value)
