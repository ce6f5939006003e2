"""Custom ops whose derivative fails when AOT autograd traces it: a compile for training (grad
mode on, an input requiring grad) traces the joint forward-and-backward graph and fails there,
while the forward alone, run eagerly or compiled for inference, works. The class of
pytorch#185715 (pow's backward with a symbolic exponent: "NYI SymInt equality"), without waiting
for a real torch bug. Registered when imported (a spec's `op_modules` names this module).
"""

from __future__ import annotations

from typing import Any

import torch

NAMESPACE = "minify_backward"


@torch.library.custom_op("minify_backward::sin_with_broken_grad", mutates_args=())
def sin_with_broken_grad(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x)


@torch.library.custom_op("minify_backward::exp_with_broken_grad", mutates_args=())
def exp_with_broken_grad(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(x)


def _same_shape(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _no_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    return None


def _sin_backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("injected failure in the backward of sin_with_broken_grad")


def _exp_backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    raise ValueError("injected failure in the backward of exp_with_broken_grad")


for _op, _backward in ((sin_with_broken_grad, _sin_backward), (exp_with_broken_grad, _exp_backward)):
    _op.register_fake(_same_shape)
    _op.register_autograd(_backward, setup_context=_no_context)
