"""Floating floor division whose exact quotient lies just below an integer: inductor rounds it up (1.0 // 0.1 == 10).

issue:    https://github.com/pytorch/pytorch/issues/197895
checks:   compiled `a // b` on float32 [1.0, 0.5, 6.0] // [0.1, 0.1, 0.2] gives eager's [9, 4, 29]
fails on: 2.13.0+cpu (checked here); the issue: 2.14.0 and nightly, CPU and CUDA
kind:     wrong values (float)
feature:  inductor lowering (floor division)
"""

import torch


def bucket(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a // b


def test_pt_197895_float_floor_div_off_by_one() -> None:
    a = torch.tensor([1.0, 0.5, 6.0])
    b = torch.tensor([0.1, 0.1, 0.2])
    expected = bucket(a, b)
    actual = torch.compile(bucket)(a, b)
    assert torch.equal(actual, expected), f"compiled {actual.tolist()} != eager {expected.tolist()}"


if __name__ == "__main__":
    test_pt_197895_float_floor_div_off_by_one()
