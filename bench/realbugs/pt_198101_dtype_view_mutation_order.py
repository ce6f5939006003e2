"""A value computed from an int32 view of an input is evaluated after a later in-place write to that input.

issue:    https://github.com/pytorch/pytorch/issues/198101
checks:   compiled `y = x.view(int32) * 2; y.sub_(-4); x[:, 2:5] = 2; return y.view(int64)` equals eager
fails on: 2.13.0+cpu (checked here); the issue: nightly 2026-09, CUDA
kind:     wrong values (integer)
feature:  inductor scheduling, in-place mutation, dtype views
"""

import torch


def read_then_overwrite(x: torch.Tensor) -> torch.Tensor:
    y = x.view(torch.int32) * 2
    y.sub_(-4)
    x[:, 2:5] = 2
    return y.view(torch.int64)


def test_pt_198101_dtype_view_mutation_order() -> None:
    x = torch.arange(-12, 12, dtype=torch.int64).reshape(4, 6)
    expected = read_then_overwrite(x.clone())
    actual = torch.compile(read_then_overwrite)(x.clone())
    assert torch.equal(actual, expected), f"compiled {actual.tolist()} != eager {expected.tolist()}"


if __name__ == "__main__":
    test_pt_198101_dtype_view_mutation_order()
