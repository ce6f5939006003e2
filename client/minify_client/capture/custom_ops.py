"""The custom ops a failing graph calls, and the Python modules that register them.

A graph that calls a custom op (`torch.ops.<ns>.<op>` outside torch's own namespaces) loads only in
a process where the op is registered, by importing the module that registers it: the worker
imports the modules the spec's `op_modules` names (where its operator allows them), so the capture
records them. Which module registered an op, asked of torch (2.13's `torch/_library`, `torch/library.py`):

1. `torch.library.custom_op`: `torch._library.custom_ops.OPDEFS[qualname]` is the op's
   `CustomOpDef`, whose `_init_fn` is the decorated function: its `__module__`.
2. An op defined in C++ that names its Python module (`m.set_python_module("pkg.ops")`):
   `torch._C._dispatch_pystub(name, overload)`, as torch's own `_check_pystubs_once` asks it.
3. Otherwise the files its registrations came from: the fake impl's source
   (`torch._library.simple_registry.singleton.get(qualname).fake_impl.kernel.source`,
   "file:line", for `torch.library.register_fake`) and the dispatcher's `registered at FILE:LINE`
   lines (`torch._C._dispatch_dump`: a `Library(ns, ...)` records where it was made). The first
   file outside torch that a loaded module was imported from names that module.

An op found none of these ways (native code with no Python module) is not recorded, with a warning
naming it. A module the worker cannot import as it is named here (the script run as `__main__`,
recorded under its file's name; a test file, which the worker rarely has) is recorded with a
warning. torch is imported only by the functions that read a graph.
"""

from __future__ import annotations

import importlib.util
import logging
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Namespaces of the ops torch itself registers (torch 2.13: every namespace of
# `torch._C._dispatch_get_all_op_names()` once torch, dynamo, inductor and export are imported).
# An op registered by torch's own Python code (a module under `torch.`) is torch's too.
TORCH_NAMESPACES = frozenset({
    "aten", "prim", "prims", "rngprims", "debugprims", "inductor_prims", "higher_order", "quantized",
    "_quantized", "quantized_decomposed", "quantization", "c10d", "c10d_functional", "_c10d_functional",
    "_c10d_functional_autograd", "_dtensor", "symm_mem", "fsdp", "streams", "static_runtime", "onednn",
    "mkldnn", "mkldnn_prepacked", "mkl", "sparse", "inductor", "profiler", "onnx", "onnx_symbolic",
    "flex_lib", "export", "debug_mode_ops", "_native", "_test", "_inductor_test",
})

_REGISTERED_AT = re.compile(r"registered at (.+?):\d+")
_TEST_FILE = re.compile(r"^(test_.*|.*_test|conftest)\.py$")


@dataclass(frozen=True)
class CustomOp:
    """One custom op a graph calls: `name` ("ns::op", its overload's qualified name) and the module
    that registers it (None: none found)."""

    name: str
    module: str | None

    @property
    def namespace(self) -> str:
        return self.name.split("::", 1)[0]


def custom_ops(graph: Any) -> list[CustomOp]:
    """The custom ops `graph` (an fx.Graph, or anything with one as `.graph`: a GraphModule, an
    ExportedProgram) calls, its subgraphs' included, each once, in the order they first appear."""
    import torch

    found: dict[str, CustomOp] = {}
    for target in _targets(getattr(graph, "graph", graph)):
        if isinstance(target, torch._ops.OpOverloadPacket):
            target = target.default if "default" in target.overloads() else None
        if not isinstance(target, torch._ops.OpOverload) or target.namespace in TORCH_NAMESPACES:
            continue
        name = target.name()
        if name not in found:
            op = CustomOp(name, _registering_module(target))
            if not _is_torch_module(op.module):
                found[name] = op
    return list(found.values())


def op_modules(graph: Any) -> list[str]:
    """The modules to record in the spec's `op_modules` for `graph` (`custom_ops`), warning about
    an op whose module was not found and a module the worker cannot import as it is named."""
    modules: dict[str, list[str]] = {}
    for op in custom_ops(graph):
        if op.module is None:
            logger.warning("minify: custom op %s is registered by native code with no Python module that torch "
                           "knows of; the worker must import the module that registers it: name it in the spec's "
                           "op_modules (--op-module MODULE)", op.name)
        else:
            modules.setdefault(op.module, []).append(op.name)
    recorded = []
    for module, ops in modules.items():
        name, problem = _importable_name(module)
        if problem:
            logger.warning("minify: custom op%s %s %s registered in %s; the spec records module %r, which the "
                           "worker will need to import: install it there (or put it on its PYTHONPATH) and allow "
                           "it with MINIFY_ALLOWED_OP_MODULES", "s" if len(ops) > 1 else "", ", ".join(ops),
                           "are" if len(ops) > 1 else "is", problem, name)
        recorded.append(name)
    return recorded


def _targets(graph: Any) -> list[Any]:
    """The call_function targets of `graph` and of every subgraph its module holds."""
    targets = [node.target for node in graph.nodes if node.op == "call_function"]
    owner = getattr(graph, "owning_module", None)
    for node in graph.nodes:
        if node.op == "get_attr" and owner is not None:
            subgraph = getattr(owner, str(node.target), None)
            if hasattr(subgraph, "graph"):
                targets += _targets(subgraph.graph)
    return targets


def _registering_module(op: Any) -> str | None:
    """The module that registered the OpOverload `op` (see the module's docstring), or None, also
    where this torch's private registries are not as read here (checked on 2.11, 2.13 and 2.15)."""
    try:
        return _read_registering_module(op)
    except (AttributeError, ImportError, RuntimeError):
        return None


def _read_registering_module(op: Any) -> str | None:
    import torch
    from torch._library import custom_ops, simple_registry

    qualname = op.name()
    definition = custom_ops.OPDEFS.get(op._schema.name)
    if definition is not None:
        return definition._init_fn.__module__
    pystub = torch._C._dispatch_pystub(op._schema.name, op._schema.overload_name)
    if pystub is not None:
        return pystub[0]
    sources = []
    registry = simple_registry.singleton
    # `get` since torch 2.13; before, the mapping itself (`find` would add an entry for the op).
    entry = registry.get(qualname) if hasattr(registry, "get") else registry._data.get(qualname)
    kernel = entry.fake_impl.kernel if entry is not None else None
    if kernel is not None:
        sources.append(kernel.source.rsplit(":", 1)[0])
    sources += _REGISTERED_AT.findall(torch._C._dispatch_dump(qualname))
    files = _module_files()
    torch_dir = Path(torch.__file__).resolve().parent
    for source in sources:
        path = Path(source).resolve()
        if torch_dir not in path.parents and path in files:
            return files[path]
    return None


def _module_files() -> dict[Path, str]:
    """Each loaded module's file, resolved, and the module's name."""
    files: dict[Path, str] = {}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if isinstance(file, str):
            files.setdefault(Path(file).resolve(), name)
    return files


def _is_torch_module(module: str | None) -> bool:
    return module is not None and (module == "torch" or module.startswith("torch."))


# The script `python -m minify_client.capture` runs as __main__ (capture/__main__.py sets it): by the
# time a capture is saved the script has ended and `sys.modules["__main__"]` is the runner again.
main_script: str | None = None


def _importable_name(module: str) -> tuple[str, str]:
    """The name the worker would import `module` by, and why it may not be able to ("" if none)."""
    if module == "__main__":
        file = main_script or getattr(sys.modules.get("__main__"), "__file__", None)
        if not file:
            return module, "the interactive session (__main__)"
        return Path(file).stem, f"the script {file} (run as __main__)"
    loaded = sys.modules.get(module)
    file = getattr(loaded, "__file__", None)
    if file and _TEST_FILE.match(Path(file).name):
        return module, f"the test file {file}"
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or (file and spec.origin and Path(spec.origin).resolve() != Path(file).resolve()):
        return module, f"{file or module}, which is not importable by that name here"
    return module, ""
