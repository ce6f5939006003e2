"""amin of 18 positive int8 values: inductor's vectorized CPU reduction returns 0, a value the tensor does not hold.

issue:    https://github.com/pytorch/pytorch/issues/191499
checks:   compiled `amin(x)` of int8 [5, 1, 100, ..., 80] equals eager's 1 (with 16 or more elements the
          vectorized path runs and pads with zeros)
fails on: 2.13.0+cpu (checked here, x86-64); the issue: Apple Silicon, then x86-64 AVX2 on 2.14 and nightly
kind:     wrong values (integer)
feature:  inductor C++ vectorized reductions (int8/uint8 min/max)
"""

import torch

VALUES = [5, 1, 100, 3, 7, 8, 9, 13, 100, 120, 127, 2, 6, 4, 11, 12, 90, 80]


def smallest(x: torch.Tensor) -> torch.Tensor:
    return torch.amin(x)


def test_pt_191499_int8_amin_vectorized() -> None:
    x = torch.tensor(VALUES, dtype=torch.int8)
    expected = smallest(x)
    actual = torch.compile(smallest)(x)
    assert torch.equal(actual, expected), f"compiled {actual.item()} != eager {expected.item()}"


if __name__ == "__main__":
    test_pt_191499_int8_amin_vectorized()
