"""Negated abs of a uint8 tensor, concatenated and summed: inductor's C++ kernel promotes abs to int and never wraps.

issue:    https://github.com/pytorch/pytorch/issues/187018
checks:   compiled `cat([-x.abs(), -x.abs()]).sum()` on uint8 [200, 200] equals eager's 224
          (4 * 56, 56 being -200 mod 256)
fails on: 2.13.0+cpu (checked here); the issue: 2.13 nightly, CPU
kind:     wrong values (integer)
feature:  inductor C++ codegen (std::abs on unsigned types), uint8 wrap-around, reductions
"""

import torch


def folded_total(x: torch.Tensor) -> torch.Tensor:
    flipped = -x.abs()
    return torch.cat([flipped, flipped]).sum()


def test_pt_187018_uint8_abs_promoted() -> None:
    x = torch.tensor([200, 200], dtype=torch.uint8)
    expected = folded_total(x)
    actual = torch.compile(folded_total)(x)
    assert torch.equal(actual, expected), f"compiled {actual.item()} != eager {expected.item()}"


if __name__ == "__main__":
    test_pt_187018_uint8_abs_promoted()
