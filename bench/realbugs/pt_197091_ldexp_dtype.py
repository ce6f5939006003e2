"""torch.ldexp of a bool mantissa and a half exponent: eager promotes to half, inductor returns float32.

issue:    https://github.com/pytorch/pytorch/issues/197091
checks:   compiled `ldexp(ones(bool), randn().half())` has eager's dtype and values
fails on: 2.13.0+cpu (checked here); the issue: 2.14.0 and nightly, CPU and CUDA
kind:     wrong values (float)
feature:  inductor lowering (dtype of a native lowering), type promotion
"""

import torch


def scale_by_power_of_two(mantissa: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    return torch.ldexp(mantissa, exponent)


def test_pt_197091_ldexp_dtype() -> None:
    torch.manual_seed(0)
    mantissa = torch.ones(3, 4, dtype=torch.bool)
    exponent = torch.randn(3, 4).half()
    expected = scale_by_power_of_two(mantissa, exponent)
    actual = torch.compile(scale_by_power_of_two)(mantissa, exponent)
    assert actual.dtype == expected.dtype and torch.allclose(actual.float(), expected.float()), (
        f"compiled {actual.dtype}, eager {expected.dtype}")


if __name__ == "__main__":
    test_pt_197091_ldexp_dtype()
