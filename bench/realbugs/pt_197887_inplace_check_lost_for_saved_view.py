"""The input of `x @ w` modified in place before backward: eager raises, inductor returns a gradient of the new x.

issue:    https://github.com/pytorch/pytorch/issues/197887
checks:   after `out = compiled(x, w)` and `x.add_(1)`, `out.sum().backward()` raises "modified by an inplace
          operation" as eager does
fails on: 2.13.0+cpu (checked here); the issue: 2.14.0 and nightly, CPU and CUDA
kind:     missing error
feature:  training (backward), AOT autograd saved tensors (views of inputs), inductor
"""

import torch


def project(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w


def backward_after_overwrite(fn) -> str:
    x = torch.arange(6.0).reshape(2, 3) / 7
    w = (torch.arange(9.0).reshape(3, 3) / 5).requires_grad_()
    out = fn(x, w)
    x.add_(1)
    try:
        out.sum().backward()
    except RuntimeError as error:
        return "raises" if "inplace operation" in str(error) else f"raises {error}"
    return f"returns grad {w.grad.sum().item():.4f}"


def test_pt_197887_inplace_check_lost_for_saved_view() -> None:
    expected = backward_after_overwrite(project)
    actual = backward_after_overwrite(torch.compile(project))
    assert actual == expected, f"compiled {actual}; eager {expected}"


if __name__ == "__main__":
    test_pt_197887_inplace_check_lost_for_saved_view()
