"""Test backends for the sandbox's own faults and the engine's guards (tests import them by path:
`"tests.support.backends:fail_always"`, allowed by the prefix `tests.support.backends`).

Each is a torch.compile-style backend `fn(gm, example_inputs) -> callable`, cheap (no compiler).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import fx

from minify_worker.testing_backends import _eager, has_op

PREFIX = "tests.support.backends"
CUDA_FORK_ERROR = ("Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, "
                   "you must use the 'spawn' start method")

# Set in a process that then forks its sandbox: its forked children see it, spawned ones do not,
# the way a process that initialized CUDA poisons its forks and only its forks.
POISONED = False


def fail_always(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Fails on every graph, the empty one included: the failure does not depend on the program."""
    raise RuntimeError("injected failure on every graph")


def cuda_fork_error_when_poisoned(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """What CUDA says in a child forked from a process that initialized it; else fails on relu."""
    if POISONED:
        raise RuntimeError(CUDA_FORK_ERROR)
    if has_op(gm, "relu"):
        raise RuntimeError("injected failure on relu")
    return _eager(gm)


def cuda_fork_error_always(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """A device this sandbox can never use: every candidate, every sandbox."""
    raise RuntimeError(CUDA_FORK_ERROR)


def failed_import_on_relu(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Inductor's way of failing on broken generated code: InductorError around the code cache's
    RuntimeError("Failed to import <path>\\nSyntaxError: ..."), whose cause was dropped."""
    if not has_op(gm, "relu"):
        return _eager(gm)
    from torch._inductor.exc import InductorError

    inner = RuntimeError("Failed to import /tmp/torchinductor_x/ab/cabq2z3kqw7wf4xq7qg3u5ohp4o.py\n"
                         "SyntaxError: invalid syntax (cabq2z3kqw7wf4xq7qg3u5ohp4o.py, line 12)")
    raise InductorError(inner, None)


def allocate_on_relu(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """A compiler that eats all memory on relu: allocates (and touches) 64 MiB chunks without bound."""
    if has_op(gm, "relu"):
        hoard = []
        while True:
            hoard.append(bytearray(b"\x01") * (64 << 20))
    return _eager(gm)


# Set in a child once it compiled a graph with sigmoid: state one candidate leaves behind for the
# next one in the same process.
_SAW_SIGMOID = False


def relu_fails_after_sigmoid(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Fails on relu once this process has compiled a sigmoid: in a fresh process, only a graph with
    both fails; in a reused one, relu alone fails after any sigmoid candidate."""
    global _SAW_SIGMOID
    if has_op(gm, "sigmoid"):
        _SAW_SIGMOID = True
    if has_op(gm, "relu") and _SAW_SIGMOID:
        raise RuntimeError("injected failure on relu after a sigmoid")
    return _eager(gm)


def device_assert_on_relu(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """A kernel that trips a CUDA device-side assert when the graph has relu (an out-of-range
    index, raised at the next synchronization): the context is unusable afterwards."""
    if not has_op(gm, "relu"):
        return _eager(gm)

    def run(*args: Any) -> Any:
        import torch

        values = torch.ones(4, device=args[0].device)
        values[torch.tensor([1 << 20], device=args[0].device)] += 1
        torch.cuda.synchronize(args[0].device)
        return gm(*args)

    return run


def _has_symbolic_sizes(gm: fx.GraphModule, example_inputs: list[Any]) -> bool:
    """Whether a placeholder's example value (dynamo's `example_value`, or `val`) or an example input
    has a SymInt size, or is a SymInt: what a dynamic compile gives a backend."""
    import torch

    values = [node.meta.get(key) for node in gm.graph.nodes if node.op == "placeholder"
              for key in ("example_value", "val")]
    for value in [*values, *example_inputs]:
        if isinstance(value, torch.SymInt):
            return True
        if isinstance(value, torch.Tensor) and any(isinstance(size, torch.SymInt) for size in value.shape):
            return True
    return False


def fail_on_symbolic_relu(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Fails on relu only when compiled with symbolic sizes (torch.compile(dynamic=True) fails, the
    default passes); else eager."""
    if has_op(gm, "relu") and _has_symbolic_sizes(gm, example_inputs):
        raise RuntimeError("injected failure on relu with symbolic sizes")
    return _eager(gm)


def _subgraph_modules(gm: fx.GraphModule) -> list[fx.GraphModule]:
    """The GraphModules a higher-order op of `gm` calls (cond's branches, a loop's body ...), nested too."""
    return [module for module in gm.modules() if isinstance(module, fx.GraphModule) and module is not gm]


def fail_on_relu_anywhere(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Fails when relu is in the graph or in any of its subgraphs; else eager."""
    if any(has_op(module, "relu") for module in [gm, *_subgraph_modules(gm)]):
        raise RuntimeError("injected failure on relu")
    return _eager(gm)


def fail_on_relu_in_subgraph(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Fails only when relu is inside a subgraph: a failure that needs the control flow."""
    if any(has_op(module, "relu") for module in _subgraph_modules(gm)):
        raise RuntimeError("injected failure on relu in a subgraph")
    return _eager(gm)
