"""Summing a float16 tensor into a bool result: inductor's C++ reduction has no bool accumulator and g++ rejects it.

issue:    https://github.com/pytorch/pytorch/issues/197106
checks:   compiled `torch.sum(x, dtype=torch.bool)` of a float16 (3, 4) tensor compiles and equals eager's True
fails on: 2.13.0+cpu (checked here: CppCompileError); the issue: 2.14.0 and nightly, CPU (GCC and MSVC)
kind:     compile error
feature:  inductor C++ reductions (sum into a bool dtype from float16)
"""

import torch


def any_nonzero(x: torch.Tensor) -> torch.Tensor:
    return torch.sum(x, dtype=torch.bool)


def test_pt_197106_half_sum_to_bool() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 4).half()
    expected = any_nonzero(x)
    actual = torch.compile(any_nonzero)(x)
    assert torch.equal(actual, expected), f"compiled {actual} != eager {expected}"


if __name__ == "__main__":
    test_pt_197106_half_sum_to_bool()
