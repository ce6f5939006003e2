"""An int64 arange times a large int64 scalar tensor: inductor computes the product in 32 bits.

issue:    https://github.com/pytorch/pytorch/issues/175966
checks:   compiled `arange(11, int64) * tensor([10**9])` equals eager (no 32-bit wrap-around)
fails on: 2.13.0+cpu (checked here); the issue: 2.11 nightly, CUDA
kind:     wrong values (integer)
feature:  inductor index/dtype propagation
"""

import torch


def scaled_range(x: torch.Tensor) -> torch.Tensor:
    return torch.arange(0, 11, dtype=torch.int64) * torch.tensor([10**9], dtype=torch.int64) + x


def test_pt_175966_arange_int64_mul() -> None:
    x = torch.zeros(1, dtype=torch.int64)
    expected = scaled_range(x)
    actual = torch.compile(scaled_range)(x)
    assert torch.equal(actual, expected), f"compiled {actual.tolist()} != eager {expected.tolist()}"


if __name__ == "__main__":
    test_pt_175966_arange_int64_mul()
