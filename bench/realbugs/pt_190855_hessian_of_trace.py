"""torch.func.hessian of a function using trace(t) * eye(n), compiled: every entry is off by about the same constant.

issue:    https://github.com/pytorch/pytorch/issues/190855
checks:   compiled `hessian(f)` of `f(t) = mean(1 / (t + trace(t) * eye(3)))` on a float64 3x3 matrix equals eager's
          (the compiled Hessian differs by up to 0.1 here)
fails on: 2.13.0+cpu (checked here); the issue: 2.11, inductor (first derivatives are right)
kind:     wrong values (float)
feature:  functorch transforms (hessian: jacfwd of jacrev) under torch.compile, AOT autograd
"""

import torch
from torch.func import hessian


def spread(t: torch.Tensor) -> torch.Tensor:
    return torch.mean(1.0 / (t + torch.trace(t) * torch.eye(3, dtype=t.dtype)))


def test_pt_190855_hessian_of_trace() -> None:
    x = torch.tensor([[0.10, 0.20, 0.30], [0.40, 0.50, 0.60], [0.70, 0.80, 0.95]], dtype=torch.float64)
    expected = hessian(spread)(x)
    actual = torch.compile(hessian(spread))(x)
    assert torch.allclose(actual, expected), f"compiled differs from eager by {(actual - expected).abs().max().item()}"


if __name__ == "__main__":
    test_pt_190855_hessian_of_trace()
