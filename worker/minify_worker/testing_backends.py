"""Cheap torch.compile-style backends that misbehave on a chosen op, for tests and the bench.

A backend is `fn(gm, example_inputs) -> callable`. Each factory below returns one that behaves
like eager unless the graph contains the chosen op (matched by its packet name: "relu" matches
`aten.relu.default`), and then fails the chosen way. Ready-made instances make them usable as a
spec backend, e.g. `"minify_worker.testing_backends:fail_on_relu"` (allowed by the prefix
`minify_worker.testing_backends` in `MINIFY_ALLOWED_BACKENDS`).

The module also holds small functions for `SandboxPool.call` tests (`echo`, `value_names`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

Backend = Callable[[fx.GraphModule, list[Any]], Callable[..., Any]]


def op_name(target: Any) -> str:
    """"relu" for `aten.relu.default`, the function name for anything else."""
    packet = getattr(target, "overloadpacket", None)
    if packet is not None:
        return packet.__name__
    return getattr(target, "__name__", str(target))


def has_op(gm: fx.GraphModule, op: str) -> bool:
    return any(node.op == "call_function" and op_name(node.target) == op for node in gm.graph.nodes)


def _eager(gm: fx.GraphModule) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        return gm(*args)

    return run


def raise_on(op: str, error: type[Exception] = RuntimeError, message: str | None = None,
             *, at: str = "compile") -> Backend:
    """Raise `error(message)` when the graph has `op`: while compiling, or (`at="run"`) when run."""
    text = message or f"injected failure on {op}"

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        if not has_op(gm, op):
            return _eager(gm)
        if at == "compile":
            raise error(text)

        def run(*args: Any) -> Any:
            raise error(text)

        return run

    return backend


def raise_on_all(*ops: str, error: type[Exception] = RuntimeError) -> Backend:
    """Raise while compiling a graph that has every op of `ops` (a bug that needs them together:
    any one of them alone compiles)."""
    text = f"injected failure on {' and '.join(ops)} together"

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        if all(has_op(gm, op) for op in ops):
            raise error(text)
        return _eager(gm)

    return backend


def signal_on(op: str, signum: int = signal.SIGSEGV) -> Backend:
    """Kill the compiling process with `signum` (a segfault by default) when the graph has `op`."""

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        if has_op(gm, op):
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            time.sleep(60)
        return _eager(gm)

    return backend


def hang_on(op: str, *, with_grandchild: bool = False) -> Backend:
    """Sleep forever while compiling a graph that has `op` (optionally with a `sleep` child, like a stuck
    compiler subprocess, to check that the whole process group dies)."""

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        if has_op(gm, op):
            if with_grandchild:
                subprocess.Popen(["sleep", "3600"])
            while True:
                time.sleep(3600)
        return _eager(gm)

    return backend


def exit_on(op: str, code: int = 3) -> Backend:
    """Exit the process with `code`, bypassing Python's cleanup, when the graph has `op`."""

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        if has_op(gm, op):
            os._exit(code)
        return _eager(gm)

    return backend


def wrong_on(op: str, delta: float = 1.0) -> Backend:
    """Run eagerly but add `delta` to every floating-point result of `op` (an accuracy bug)."""

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        class Wrong(fx.Interpreter):
            def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
                result = super().call_function(target, args, kwargs)
                if op_name(target) == op and isinstance(result, torch.Tensor) and result.is_floating_point():
                    return result + delta
                return result

        def run(*args: Any) -> Any:
            return Wrong(gm).run(*args)

        return run

    return backend


def oom_on(op: str) -> Backend:
    """Raise the error an allocator raises when it runs out of memory, when the graph has `op`."""
    return raise_on(op, torch.OutOfMemoryError, "CUDA out of memory. Tried to allocate 2.00 GiB", at="run")


def by_op(backends: dict[str, Backend]) -> Backend:
    """The backend for the first op of `backends` the graph has (in the dict's order), else eager."""

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        for op, chosen in backends.items():
            if has_op(gm, op):
                return chosen(gm, example_inputs)
        return _eager(gm)

    return backend


fail_on_relu = raise_on("relu")
fail_on_relu_at_runtime = raise_on("relu", at="run")
fail_on_cos = raise_on("cos", ValueError, "injected failure on cos")
segfault_on_relu = signal_on("relu", signal.SIGSEGV)
abort_on_relu = signal_on("relu", signal.SIGABRT)
hang_on_relu = hang_on("relu")
hang_with_grandchild_on_relu = hang_on("relu", with_grandchild=True)
exit_on_relu = exit_on("relu")
wrong_on_relu = wrong_on("relu")
oom_on_relu = oom_on("relu")
fail_on_sin_and_relu = raise_on_all("sin", "relu")
# The bench's zoo (bench/zoo.py): two ops far apart in a model, and a wrong softmax.
fail_on_max_pool_and_mean = raise_on_all("max_pool2d_with_indices", "mean")
fail_on_gelu_and_layer_norm = raise_on_all("gelu", "native_layer_norm")
wrong_on_softmax = wrong_on("_softmax")

# One backend that misbehaves a different way per op, so one warm pool can show every outcome.
misbehave_by_op = by_op({
    "relu": raise_on("relu"),
    "neg": raise_on("neg", at="run"),
    "cos": raise_on("cos", ValueError, "injected failure on cos"),
    "sin": signal_on("sin", signal.SIGSEGV),
    "tanh": hang_on("tanh", with_grandchild=True),
    "exp": exit_on("exp"),
    "sigmoid": oom_on("sigmoid"),
    "abs": wrong_on("abs"),
})


def echo(context: Any, **kwargs: Any) -> dict[str, Any]:
    """A `SandboxPool.call` target: returns its arguments and the child's pid."""
    return {"kwargs": kwargs, "pid": os.getpid()}


def value_names(context: Any) -> dict[str, Any]:
    """A `SandboxPool.call` target: the names in the value store the child sees."""
    return {"names": sorted(context.values)}


def temp_dir(context: Any) -> dict[str, Any]:
    """A `SandboxPool.call` target: where the child's temporary files and inductor caches go."""
    import tempfile

    return {"tempdir": tempfile.gettempdir(), "inductor_cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR")}


def run_with_spec(context: Any, *, wire_graph: dict[str, Any], spec_json: str) -> dict[str, Any]:
    """A `SandboxPool.call` target: run a candidate under another spec (tests reuse one warm pool)."""
    from minify_client.models import JobSpec

    from .outcomes import outcome_to_dict
    from .runner import run_wire_candidate

    spec = JobSpec.model_validate_json(spec_json)
    return outcome_to_dict(run_wire_candidate(wire_graph, context.values, spec, context.workdir))


def crash_in_call(context: Any) -> dict[str, Any]:
    """A `SandboxPool.call` target that segfaults."""
    os.kill(os.getpid(), signal.SIGSEGV)
    return {}


def first_match(*rules: tuple[str, Backend]) -> Backend:
    """The backend of the first rule whose op the graph has; eager when none matches."""

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        for op, inner in rules:
            if has_op(gm, op):
                return inner(gm, example_inputs)
        return _eager(gm)

    return backend


fail_on_relu_hang_on_sin = first_match(("relu", fail_on_relu), ("sin", hang_on("sin")))
fail_on_relu_other_error_on_cos = first_match(("relu", fail_on_relu), ("cos", fail_on_cos))


def fail_once_on(op: str) -> Backend:
    """Raise on `op` in the first process to compile it, pass everywhere after: a flaky failure.

    "First" is decided by creating `fail-once-<op>` in `$MINIFY_TEST_MARKER_DIR` (O_EXCL), so
    exactly one of several concurrent runs fails.
    """
    inner = raise_on(op)

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        if has_op(gm, op):
            marker = os.path.join(os.environ["MINIFY_TEST_MARKER_DIR"], f"fail-once-{op}")
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return _eager(gm)
        return inner(gm, example_inputs)

    return backend


fail_once_on_relu = fail_once_on("relu")


def kill_sandbox_on(op: str) -> Backend:
    """SIGKILL the process that forked this one (the sandbox's fork server) when the graph has `op`."""

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        if has_op(gm, op):
            os.kill(os.getppid(), signal.SIGKILL)
            time.sleep(60)
        return _eager(gm)

    return backend


kill_sandbox_on_relu = kill_sandbox_on("relu")
fail_on_relu_kill_sandbox_on_sin = first_match(("relu", fail_on_relu), ("sin", kill_sandbox_on("sin")))


def inductor_config_values(context: object, keys: list[str]) -> dict[str, Any]:
    """A `SandboxPool.call` target: these `torch._inductor.config` values as a child sees them."""
    import torch._inductor.config as inductor_config

    return {key: getattr(inductor_config, key) for key in keys}
