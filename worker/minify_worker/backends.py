"""The backends a candidate is compiled with, and the inductor config it is compiled under.

A backend is a function `compile(gm, inputs) -> callable`: raising means a compile error, the
callable raising means a runtime error. Runs in sandbox children only.

- `inductor`: `torch._inductor.compile_fx.compile_fx` on the aten graph, under `torch.no_grad()`.
- `aot_inductor`: `torch.export.export` of the candidate, `aoti_compile_and_package` into a
  temp dir in the job's work dir, `aoti_load_package`, and the loaded package is what runs.
- `aot_eager`, `eager`: torch's own debug backends.
- `"pkg.module:callable"`: a torch.compile backend `fn(gm, example_inputs) -> callable`, imported
  only when its module path starts with one of the comma-separated prefixes in
  `MINIFY_ALLOWED_BACKENDS`.
"""

from __future__ import annotations

import importlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import fx

Compiled = Callable[..., Any]
Backend = Callable[[fx.GraphModule, list[Any]], Compiled]

ALLOWED_BACKENDS_ENV = "MINIFY_ALLOWED_BACKENDS"


class BackendError(Exception):
    """The job's backend or config cannot be used: a problem of the job, not of a candidate."""


def allowed_prefixes() -> list[str]:
    raw = os.environ.get(ALLOWED_BACKENDS_ENV, "")
    return [prefix.strip() for prefix in raw.split(",") if prefix.strip()]


def _module_allowed(module: str, prefixes: list[str]) -> bool:
    return any(module.startswith(prefix) for prefix in prefixes)


def load_custom_backend(name: str) -> Backend:
    """Import `pkg.module:callable` if `MINIFY_ALLOWED_BACKENDS` allows its module."""
    module_name, _, attribute = name.partition(":")
    prefixes = allowed_prefixes()
    if not _module_allowed(module_name, prefixes):
        raise BackendError(
            f"custom backend {name!r} is not allowed: its module must start with one of the prefixes in "
            f"{ALLOWED_BACKENDS_ENV} (now {','.join(prefixes) or 'empty'}); the worker's operator sets it"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise BackendError(f"custom backend {name!r}: cannot import {module_name}: {error}") from error
    backend = getattr(module, attribute, None)
    if not callable(backend):
        raise BackendError(f"custom backend {name!r}: {module_name} has no callable {attribute!r}")
    return backend


def _call(compiled: Compiled, args: list[Any]) -> Any:
    """Call what a torch.compile backend returned, as dynamo does: unboxed. (Its `_boxed_call`
    attribute is not reliable: `functools.wraps` copies it onto unboxed wrappers.)"""
    return compiled(*args)


def _inductor(gm: fx.GraphModule, inputs: list[Any]) -> Compiled:
    from torch._inductor.compile_fx import compile_fx

    with torch.no_grad():
        compiled = compile_fx(gm, list(inputs))

    def run(*args: Any) -> Any:
        with torch.no_grad():
            return _call(compiled, list(args))

    return run


def _aot_inductor(workdir: Path) -> Backend:
    def compile_aoti(gm: fx.GraphModule, inputs: list[Any]) -> Compiled:
        import torch._inductor

        package_dir = Path(tempfile.mkdtemp(prefix="aoti-", dir=workdir))
        with torch.no_grad():
            exported = torch.export.export(gm, tuple(inputs))
            package = torch._inductor.aoti_compile_and_package(
                exported, package_path=str(package_dir / "candidate.pt2")
            )
            loaded = torch._inductor.aoti_load_package(package)

        def run(*args: Any) -> Any:
            with torch.no_grad():
                return loaded(*args)

        return run

    return compile_aoti


def _registered(name: str) -> Backend:
    def compile_registered(gm: fx.GraphModule, inputs: list[Any]) -> Compiled:
        from torch._dynamo.backends.registry import lookup_backend

        return lookup_backend(name)(gm, list(inputs))

    return compile_registered


def resolve_backend(name: str, workdir: Path) -> Backend:
    """The compile function for the spec's `backend` (raises `BackendError` if it cannot be used)."""
    if name == "inductor":
        return _inductor
    if name == "aot_inductor":
        return _aot_inductor(workdir)
    if name in ("aot_eager", "eager"):
        return _registered(name)
    if ":" in name:
        return load_custom_backend(name)
    raise BackendError(f"unknown backend {name!r}")


def run_compiled(compiled: Compiled, inputs: list[Any]) -> Any:
    return _call(compiled, inputs)


# Config keys with these prefixes are set in those modules; any other key is torch._inductor.config's.
CONFIG_MODULES = ("torch._dynamo.config.", "torch._functorch.config.", "torch._inductor.config.")


def apply_inductor_config(overrides: dict[str, Any]) -> None:
    """Set each dotted config key: `cpp.inject_relu_bug_TESTING_ONLY` in `torch._inductor.config`,
    `torch._dynamo.config.X` and `torch._functorch.config.X` in theirs (as captures record them)."""
    for key, value in overrides.items():
        prefix = next((prefix for prefix in CONFIG_MODULES if key.startswith(prefix)), "torch._inductor.config.")
        module_name = prefix.rstrip(".")
        owner: Any = importlib.import_module(module_name)
        *path, leaf = key.removeprefix(prefix).split(".")
        try:
            for part in path:
                owner = getattr(owner, part)
            getattr(owner, leaf)
        except AttributeError:
            raise BackendError(f"unknown {module_name} key {key!r}") from None
        try:
            setattr(owner, leaf, value)
        except Exception as error:
            raise BackendError(f"cannot set {module_name}.{key.removeprefix(prefix)} = {value!r}: {error}") from error


def configure_child(compile_threads: int = 1) -> None:
    """Settings every sandbox child compiles under: one compile thread, caches in the work dir
    (the environment set by the pool points TORCHINDUCTOR_CACHE_DIR and TMPDIR there)."""
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = compile_threads
