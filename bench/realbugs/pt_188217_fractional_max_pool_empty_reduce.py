"""FractionalMaxPool2d (kernel size -2, which eager accepts) then LocalResponseNorm: inductor reduces an empty list.

issue:    https://github.com/pytorch/pytorch/issues/188217
checks:   compiled `hardsigmoid(logsigmoid(LocalResponseNorm(FractionalMaxPool2d(-2, output_size=2)(x))))` on a
          float64 (1, 3, 32, 32) input runs and returns eager's (1, 3, 2, 2) shape
fails on: 2.13.0+cpu (checked here); the issue: nightly, CPU
kind:     compile error
feature:  inductor lowering (FractionalMaxPool2d then LocalResponseNorm), nn.Module, float64
"""

import torch
import torch.nn.functional as F

pool = torch.nn.FractionalMaxPool2d(-2, output_size=(2, 2), return_indices=True).eval()
norm = torch.nn.LocalResponseNorm(2, alpha=0.03).eval()


def pooled(x: torch.Tensor) -> torch.Tensor:
    values, _ = pool(x)
    return F.hardsigmoid(F.logsigmoid(norm(values)))


def test_pt_188217_fractional_max_pool_empty_reduce() -> None:
    torch.manual_seed(0)
    x = torch.rand(1, 3, 32, 32, dtype=torch.float64)
    expected = pooled(x)
    with torch.no_grad():
        actual = torch.compile(pooled)(x)
    assert actual.shape == expected.shape, f"compiled shape {tuple(actual.shape)} != eager {tuple(expected.shape)}"


if __name__ == "__main__":
    test_pt_188217_fractional_max_pool_empty_reduce()
