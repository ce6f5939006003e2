"""torch.any of a uint8 tensor: eager keeps uint8, inductor returns bool, so later uint8 arithmetic stops wrapping.

issue:    https://github.com/pytorch/pytorch/issues/198081
checks:   compiled `torch.any(x) * 200 + 100` of a uint8 (2, 2) tensor with one nonzero equals eager's
          tensor(44, dtype=torch.uint8); compiled returns tensor(300) (int64)
fails on: 2.13.0+cpu (checked here); the issue: 2.14.0 and nightly, CPU and CUDA (aot_eager is right)
kind:     wrong values (integer)
feature:  inductor lowering (reduce_any casts to bool, dropping the legacy uint8 result dtype), uint8 wrap-around
"""

import torch


def scaled_flag(x: torch.Tensor) -> torch.Tensor:
    return torch.any(x) * 200 + 100


def test_pt_198081_uint8_any_dtype() -> None:
    x = torch.tensor([[0, 3], [0, 0]], dtype=torch.uint8)
    expected = scaled_flag(x)
    actual = torch.compile(scaled_flag)(x)
    assert actual.dtype == expected.dtype, f"compiled dtype {actual.dtype} != eager {expected.dtype}"
    assert torch.equal(actual, expected), f"compiled {actual} != eager {expected}"


if __name__ == "__main__":
    test_pt_198081_uint8_any_dtype()
