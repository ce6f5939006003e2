"""avg_pool1d with ceil_mode=True: inductor's backward divides the overhanging last window by the whole kernel.

issue:    https://github.com/pytorch/pytorch/issues/198119
checks:   the gradient of compiled `avg_pool1d(x, 3, stride=2, ceil_mode=True).sum()` on a length-4 input equals
          eager's [1/3, 1/3, 5/6, 1/2]
fails on: 2.13.0+cpu (checked here); the issue: 2.14.0 and nightly, CPU and CUDA
kind:     wrong values (float)
feature:  training (backward), inductor lowering (avg_pool backward, ceil_mode)
"""

import torch
import torch.nn.functional as F


def pooled_total(x: torch.Tensor) -> torch.Tensor:
    return F.avg_pool1d(x, kernel_size=3, stride=2, ceil_mode=True).sum()


def input_grad(fn, x: torch.Tensor) -> torch.Tensor:
    x = x.detach().clone().requires_grad_()
    fn(x).backward()
    return x.grad


def test_pt_198119_avg_pool_ceil_mode_grad() -> None:
    x = torch.arange(4.0).reshape(1, 1, 4)
    expected = input_grad(pooled_total, x)
    actual = input_grad(torch.compile(pooled_total), x)
    assert torch.allclose(actual, expected), f"compiled {actual.tolist()} != eager {expected.tolist()}"


if __name__ == "__main__":
    test_pt_198119_avg_pool_ceil_mode_grad()
