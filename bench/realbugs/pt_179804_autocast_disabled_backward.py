"""A matmul under autocast(enabled=False) inside an autocast region: AOT autograd's backward runs it in bfloat16.

issue:    https://github.com/pytorch/pytorch/issues/179804
checks:   under CPU autocast(bfloat16), the weight and input gradients of compiled (backend="aot_eager")
          `x.float() @ w.float().T` inside `autocast(enabled=False)` equal eager's float32 ones
fails on: 2.13.0+cpu (checked here: aot_eager and inductor); the issue: 2026-04, CUDA autocast, aot_eager
kind:     wrong values (float)
feature:  training (backward), AOT autograd (autocast state of the backward graph)
"""

import torch


def full_precision_product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cpu", enabled=False):
        return x.float() @ w.float().T


def grads(fn) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, generator=generator).requires_grad_()
    w = torch.randn(8, 8, generator=generator).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fn(x, w)
    out.sum().backward()
    return w.grad, x.grad


def test_pt_179804_autocast_disabled_backward() -> None:
    expected = grads(full_precision_product)
    actual = grads(torch.compile(full_precision_product, backend="aot_eager"))
    for got, want in zip(actual, expected, strict=True):
        assert torch.equal(got, want), f"compiled differs from eager by {(got - want).abs().max().item()}"


if __name__ == "__main__":
    test_pt_179804_autocast_disabled_backward()
