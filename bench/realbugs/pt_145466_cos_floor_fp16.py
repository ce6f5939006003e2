"""floor(cos(x)) in fp16 on CPU: inductor's vectorized cos lands on the other side of an integer.

issue:    https://github.com/pytorch/pytorch/issues/145466
checks:   compiled `floor(cos(x))` on a 32x32 fp16 input equals eager exactly
fails on: 2.13.0+cpu (checked here); the issue: 2.7 nightly, CPU
kind:     wrong values (float)
feature:  inductor C++ vectorization, fp16
"""

import torch


def floor_of_cos(x: torch.Tensor) -> torch.Tensor:
    return torch.floor(torch.cos(x))


def test_pt_145466_cos_floor_fp16() -> None:
    torch.manual_seed(0)
    x = torch.randn(32, 32, dtype=torch.float16)
    expected = floor_of_cos(x)
    actual = torch.compile(floor_of_cos)(x)
    assert torch.equal(actual, expected), f"{(actual != expected).sum()} of {x.numel()} differ"


if __name__ == "__main__":
    test_pt_145466_cos_floor_fp16()
