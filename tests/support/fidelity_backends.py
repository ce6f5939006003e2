"""The fidelity families' torch.compile backends (tests/client/capture/test_fidelity_*.py, issue 38).

They live here, importing torch alone, because each is imported again by every repro.py its
family writes (a repro of a custom backend imports its module by path): from the test module, each
such import also loaded pytest, the capture client and the engine (~0.9 CPU-s a repro, issue 41).
The test modules capture with them, sandbox children and repro.py import them by this name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import fx

# -- test_fidelity_constants: wrong when a constant tensor is folded into the graph -----------


def _wrong_when_constants_are_folded(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """AOT autograd's forward compiler: eager, but every tensor output off by one when an op
    computes with a tensor constant of the graph (a get_attr, through its copies), as inductor's
    kernels were wrong with the constant folded in. A graph that only returns it is right."""
    from torch._functorch.aot_autograd import make_boxed_func

    copies = {"lift_fresh_copy", "detach", "detach_", "clone", "alias", "_to_copy"}
    constant = {node for node in gm.graph.nodes
                if node.op == "get_attr" and isinstance(getattr(gm, str(node.target), None), torch.Tensor)}
    folded = False
    for node in gm.graph.nodes:
        if node.op != "call_function" or not constant.intersection(node.all_input_nodes):
            continue
        packet = getattr(node.target, "overloadpacket", None)
        if packet is not None and packet.__name__ in copies:
            constant.add(node)
        else:
            folded = True

    def run(*args: Any) -> Any:
        outputs = gm(*args)
        if not folded:
            return outputs
        return [value + 1 if isinstance(value, torch.Tensor) and value.dtype != torch.bool else value
                for value in outputs]

    return make_boxed_func(run)


def wrong_with_a_constant(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """A torch.compile backend: AOT autograd (inference) with `_wrong_when_constants_are_folded`."""
    from torch._dynamo.backends.common import aot_autograd

    return aot_autograd(fw_compiler=_wrong_when_constants_are_folded)(gm, example_inputs)


# -- test_fidelity_factories: fails on an input-free factory op ------------------------------

FACTORIES = ("randperm", "arange", "full", "rand")


def _name(target: Any) -> str:
    packet = getattr(target, "overloadpacket", None)
    return packet.__name__ if packet is not None else getattr(target, "__name__", str(target))


def fail_on_an_input_free_factory(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """A torch.compile backend: eager, unless the graph calls a factory op with no input node
    (dynamo's `torch.randperm(8)`, the worker's `aten.randperm.default(8)`): then it raises."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and not node.all_input_nodes and _name(node.target) in FACTORIES:
            raise RuntimeError(f"injected failure on an input-free {_name(node.target)}")
    return gm.forward


# -- test_fidelity_mutation: computes from the inputs as the program wrote them -------------


def reads_after_writes(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """A torch.compile backend: runs the graph (its writes land in the inputs, as they should),
    then returns what the graph computes from the inputs as written: wrong wherever the program
    read an input before writing into it, right for a program that writes into none."""
    def run(*args: Any) -> Any:
        gm(*args)
        return gm(*[value.clone() if isinstance(value, torch.Tensor) else value for value in args])

    return run
