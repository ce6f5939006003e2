"""Graphs that hold custom `torch.autograd.Function`s: captured with their backward.

Dynamo hands a backend a custom autograd.Function as one higher-order op,
`autograd_function_apply(fwd_body, bwd_body, *operands, non_differentiable_idx=..., ...)`, its
forward and backward as subgraphs. A compile for training runs it inside AOT autograd, which
traces the joint forward-and-backward graph through both; a failure there (pytorch#172956: a
backward that mutates a tensor it saved, `Node add was invalid, but is output` in the partitioner)
needs both. `torch.export` keeps a Function's forward only, so no exported program can carry it.

`lower(module, inputs)` traces dynamo's graph to aten ops with `make_fx` (fake tensors: nothing of
the user's runs, no value of theirs changes), except each `autograd_function_apply`, which stays the
higher-order op over its forward and backward lowered the same way. The higher-order op runs such
subgraphs as it runs dynamo's (`torch.fx.Interpreter` inside a `torch.autograd.Function`), so a
training compile of the lowered graph traces and partitions the same joint graph. The lowered
graph is written as program.json (`program_file.GraphProgram`): torch.export cannot hold it.

Relies on (checked on torch 2.11-2.15): the op at `torch.ops.higher_order.autograd_function_apply`
taking `(fwd, bwd, *operands, **kwargs)`, its forward returning `(outputs, saved)` and its backward
taking `(*grads, *saved)`; `make_fx`'s `get_proxy_mode`, `disable_proxy_modes_tracing` and
`track_tensor_tree`, as torch's own higher-order ops trace themselves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def autograd_function_op() -> Any:
    import torch

    return torch.ops.higher_order.autograd_function_apply


def lower(module: Any, inputs: Sequence[Any]) -> Any:
    """`module` (dynamo's GraphModule) as aten ops traced on fake copies of `inputs`, each custom
    autograd.Function kept as `autograd_function_apply` over its lowered forward and backward; its
    placeholders are `module`'s, in order and by name."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils._python_dispatch import _disable_current_modes

    from .transforms import preserved_state

    detached = [value.detach() if isinstance(value, torch.Tensor) else value for value in inputs]
    with preserved_state(), _disable_current_modes(), torch.no_grad():
        lowered = make_fx(_keeping_functions(module).run, tracing_mode="fake")(*detached)
    lowered.graph.eliminate_dead_code()
    names = [node.name for node in module.graph.nodes if node.op == "placeholder"]
    for node, name in zip((node for node in lowered.graph.nodes if node.op == "placeholder"), names, strict=True):
        node.target = node.name = name
    lowered.recompile()
    return lowered


def _keeping_functions(module: Any) -> Any:
    """An `fx.Interpreter` of dynamo's graph `module` that records each `autograd_function_apply`
    call as it is, over lowered subgraphs, instead of tracing through it."""
    import torch.fx

    class KeepingFunctions(torch.fx.Interpreter):
        def call_function(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if target is autograd_function_op():
                return _record_function(args, kwargs)
            return super().call_function(target, args, kwargs)

    return KeepingFunctions(module)


def _record_function(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Record one `autograd_function_apply` in the graph being traced: its forward and backward
    traced on their own, the op's node over them, its outputs as the forward computes them."""
    import torch
    from torch.fx.experimental.proxy_tensor import (
        disable_proxy_modes_tracing,
        get_proxy_mode,
        make_fx,
        track_tensor_tree,
    )
    from torch.utils import _pytree as pytree

    mode = get_proxy_mode()
    if mode is None:
        raise RuntimeError("autograd_function_apply outside a make_fx trace")
    tracer = mode.tracer
    fwd, bwd, *operands = args
    with disable_proxy_modes_tracing():
        forward = make_fx(fwd, tracing_mode="fake")(*operands)
        outputs, saved = forward(*operands)
        grads = [torch.empty_like(value) for value in pytree.tree_leaves(outputs) if isinstance(value, torch.Tensor)]
        backward = make_fx(bwd, tracing_mode="fake")(*grads, *saved)
    proxies = []
    for role, body in (("fwd", forward), ("bwd", backward)):
        name = _free_name(tracer.root, f"{role}_body")
        tracer.root.register_module(name, body)
        proxies.append(tracer.create_proxy("get_attr", name, (), {}))
    operand_proxies = pytree.tree_map_only(torch.Tensor, tracer.unwrap_proxy, tuple(operands))
    node = tracer.create_proxy("call_function", autograd_function_op(), (*proxies, *operand_proxies), kwargs)
    return track_tensor_tree(outputs, node, constant=None, tracer=tracer)


def _free_name(root: Any, stem: str) -> str:
    index = 0
    while hasattr(root, f"{stem}_{index}"):
        index += 1
    return f"{stem}_{index}"
