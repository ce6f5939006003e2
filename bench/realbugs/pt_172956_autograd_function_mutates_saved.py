"""An autograd.Function whose backward mutates a tensor it saved, that the forward also returns: AOT's partition fails.

issue:    https://github.com/pytorch/pytorch/issues/172956
checks:   compiled (aot_eager_decomp_partition, fullgraph) function returning `(Fn.apply(x, offsets).clone(), offsets)`
          compiles and runs
fails on: 2.13.0+cpu (checked here); the issue: 2.11 nightly (2026-01)
kind:     compile error
feature:  AOT autograd partitioner, custom autograd.Function, training (backward)
"""

import torch


class DoubleAndBumpSaved(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(offsets)
        return x * 2

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (offsets,) = ctx.saved_tensors
        offsets.add_(grad_out)
        return grad_out.clone(), None


def double_with_offsets(x: torch.Tensor):
    offsets = x.clone()
    return DoubleAndBumpSaved.apply(x, offsets).clone(), offsets


def test_pt_172956_autograd_function_mutates_saved() -> None:
    x = torch.randn(64, requires_grad=True)
    torch.compile(double_with_offsets, backend="aot_eager_decomp_partition", fullgraph=True)(x)


if __name__ == "__main__":
    test_pt_172956_autograd_function_mutates_saved()
