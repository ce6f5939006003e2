"""Gradient of pow with an int exponent passed in, under dynamic=True: AOT autograd hits "NYI SymInt equality".

issue:    https://github.com/pytorch/pytorch/issues/185715
checks:   compiled (dynamic=True) `y = pow(x, e); autograd.grad(y.sum(), x)` with e=0 returns eager's y and gradient
fails on: 2.13.0+cpu (checked here); the issue: 2.13 nightly, CUDA, aot_eager and inductor
kind:     compile error
feature:  dynamic shapes (symbolic int arguments), AOT autograd joint graph, training (autograd.grad)
"""

import torch


def power_and_grad(x: torch.Tensor, exponent: int) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.pow(x, exponent)
    (grad,) = torch.autograd.grad(y.sum(), x)
    return y, grad


def test_pt_185715_pow_symint_exponent_grad() -> None:
    x = torch.full((1, 3), 2.0, requires_grad=True)
    expected = power_and_grad(x, 0)
    actual = torch.compile(power_and_grad, dynamic=True)(x, 0)
    for got, want in zip(actual, expected, strict=True):
        assert torch.equal(got, want), f"compiled {got.tolist()} != eager {want.tolist()}"


if __name__ == "__main__":
    test_pt_185715_pow_symint_exponent_grad()
