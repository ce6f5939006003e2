"""Graphs that hold `torch.func` transforms: lowered to the aten ops they compute, and run without
leaving torch's autograd and functorch state changed.

Under `torch.compile`, dynamo inlines a transform (`vmap`, `grad`, `jacfwd`, `jacrev`, `hessian`,
`jvp`, `vjp`, and `associative_scan`'s generic path, which vmaps its combine function) into the graph
it hands the backend as the transform's own bookkeeping: calls that push and pop functorch levels
(`_vmap_increment_nesting`, `_grad_increment_nesting`, `_enter_dual_level` ...), wrap and unwrap
tensors, and `_autograd_grad`. Such a graph means something only when run whole, in the grad mode it
was compiled in. On torch 2.13 `torch.export` cannot trace it (`'Tensor' object has no attribute
'constant'` at `_unpack_dual`), and run under `no_grad` it raises half way, leaving a functorch level
pushed: dynamo's functorch guard then fails on the frame being compiled ("Guard failed on the same
frame it was created"), so a capture that ran it changed the user's program.

`lower` traces such a graph with `make_fx` (fake tensors, in the grad mode of the compile): the
transforms run and what is recorded is the aten ops they compute (dead ones dropped), the graph AOT
autograd hands inductor before its decompositions. It exports, saves and loads as any graph does.
`preserved_state` puts back the state a graph run may change (functorch levels, forward-AD level,
grad modes, saved-tensor hooks, in-place requires_grad) whatever happened inside.

Relies on (checked on torch 2.13.0): the functorch calls living in `torch._functorch.*`,
`torch._C._functorch` and `torch.autograd.forward_ad`; `torch._C._functorch.get_dynamic_layer_stack_depth`
and `pop_dynamic_layer_stack_and_undo_to_depth` (dynamo's own cleanup after a frame);
`get/set_inplace_requires_grad_allowed`; `torch._C._autograd._saved_tensors_hooks_get_disabled_error_message`;
`torch._C._enter_dual_level` / `_exit_dual_level`; `make_fx(tracing_mode="fake")`. Where one is missing
(another torch), the state it covers is not put back and `transform_calls` finds what it can.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

logger = logging.getLogger(__name__)

# Where the calls a transform leaves in a dynamo graph are defined (torch 2.11-2.13).
_TRANSFORM_MODULES = ("torch._functorch", "torch._C._functorch", "torch.autograd.forward_ad")
_TRANSFORM_NAMES = frozenset({"_set_fwd_grad_enabled", "_saved_tensors_hooks_disable", "_saved_tensors_hooks_enable"})


def transform_calls(graph: Any) -> list[str]:
    """The names of the `torch.func` transform calls in `graph` (an fx.Graph), each once: empty for
    a graph that exports as it is."""
    found: dict[str, None] = {}
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        module = getattr(node.target, "__module__", None) or ""
        name = getattr(node.target, "__name__", "")
        if module.startswith(_TRANSFORM_MODULES) or name in _TRANSFORM_NAMES:
            found[name or repr(node.target)] = None
    return list(found)


def lower(module: Any, inputs: Sequence[Any], *, grad_enabled: bool) -> Any:
    """`module` (a GraphModule holding transform calls) traced to the aten ops it computes on
    `inputs`, in the grad mode it was compiled in; its placeholders are `module`'s, in order."""
    import torch
    from torch._guards import tracing
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils._python_dispatch import _disable_current_modes

    # Outside dynamo's tracing context, whose fake mode make_fx would otherwise reuse: there, the
    # meta of a batched `diagonal_copy` (pytorch#190855's hessian of a trace) raised half way, the
    # check was skipped, and dynamo's shape environment could no longer build the user's frame's
    # guards (an IndexError in the user's program where the accuracy check was on).
    with preserved_state(), _disable_current_modes(), tracing(None), torch.set_grad_enabled(grad_enabled):
        lowered = make_fx(module, tracing_mode="fake")(*inputs)
    # Dead code goes: forward AD's zero tangents leave products computed on the meta device and
    # never read, which a run that keeps every value (the worker's) cannot copy.
    lowered.graph.eliminate_dead_code()
    lowered.recompile()
    return lowered


@contextlib.contextmanager
def preserved_state() -> Iterator[None]:
    """Put back, on the way out, the autograd and functorch state that running or tracing a graph
    with transform calls may leave changed when it raises half way."""
    import torch

    restore = [_saved(read, torch) for read in (_grad_modes, _functorch_levels, _dual_level, _saved_tensor_hooks,
                                                 _inplace_requires_grad)]
    try:
        yield
    finally:
        for put_back in reversed(restore):
            try:
                put_back()
            except Exception:  # a state this torch keeps differently: nothing more to restore
                logger.debug("minify: restoring torch state failed", exc_info=True)


def _saved(read: Callable[[Any], Callable[[], None]], torch: Any) -> Callable[[], None]:
    """`read(torch)`, which saves one piece of state and returns what puts it back; nothing to put
    back where this torch keeps that state differently."""
    try:
        return read(torch)
    except (AttributeError, RuntimeError):
        logger.debug("minify: cannot save torch state with %s", read.__name__, exc_info=True)
        return lambda: None


def _grad_modes(torch: Any) -> Any:
    grad, forward = torch.is_grad_enabled(), torch._C._is_fwd_grad_enabled()

    def put_back() -> None:
        torch._C._set_grad_enabled(grad)
        torch._C._set_fwd_grad_enabled(forward)

    return put_back


def _functorch_levels(torch: Any) -> Any:
    functorch = torch._C._functorch
    if not hasattr(functorch, "get_dynamic_layer_stack_depth"):
        return lambda: None
    depth = functorch.get_dynamic_layer_stack_depth()

    def put_back() -> None:
        if functorch.get_dynamic_layer_stack_depth() != depth:
            functorch.pop_dynamic_layer_stack_and_undo_to_depth(depth)

    return put_back


def _dual_level(torch: Any) -> Any:
    """A forward-AD level left open (torch allows one): closed again when none was open before."""
    was_open = _dual_level_open(torch)

    def put_back() -> None:
        if not was_open and _dual_level_open(torch):
            torch._C._exit_dual_level(level=0)

    return put_back


def _dual_level_open(torch: Any) -> bool:
    try:
        level = torch._C._enter_dual_level()
    except RuntimeError:  # "Nested forward mode AD is not supported": one is open
        return True
    torch._C._exit_dual_level(level=level)
    return False


def _saved_tensor_hooks(torch: Any) -> Any:
    autograd = torch._C._autograd
    message = autograd._saved_tensors_hooks_get_disabled_error_message()

    def put_back() -> None:
        if autograd._saved_tensors_hooks_get_disabled_error_message() == message:
            return
        if message is None:
            autograd._saved_tensors_hooks_enable()
        else:
            autograd._saved_tensors_hooks_disable(message, fail_if_non_empty=False)

    return put_back


def _inplace_requires_grad(torch: Any) -> Any:
    functorch = torch._C._functorch
    allowed = functorch.get_inplace_requires_grad_allowed()
    return lambda: functorch.set_inplace_requires_grad_allowed(allowed)
