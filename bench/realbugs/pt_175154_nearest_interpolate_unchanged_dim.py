"""Nearest interpolation by 1.3 of a width-2 row: the width stays 2, eager copies it, compiled resamples it.

issue:    https://github.com/pytorch/pytorch/issues/175154
checks:   compiled `interpolate([[[[1., 2.]]]], scale_factor=1.3, mode="nearest")` equals eager's [[[[1., 2.]]]]
          (the output size equals the input size, so eager maps each pixel to itself; compiled gives [1., 1.])
fails on: 2.13.0+cpu (checked here); the issue: 2.11 nightly, CPU, with inductor and aot_eager; #198201 (2.14) the same
          on a 2-D scale
kind:     wrong values (float)
feature:  decompositions (upsample_nearest with a non-unit scale on an unchanged dim)
"""

import torch
import torch.nn.functional as F


def upscale(x: torch.Tensor) -> torch.Tensor:
    return F.interpolate(x, scale_factor=1.3, mode="nearest")


def test_pt_175154_nearest_interpolate_unchanged_dim() -> None:
    x = torch.tensor([[[[1.0, 2.0]]]], dtype=torch.float64)
    expected = upscale(x)
    actual = torch.compile(upscale)(x.clone())
    assert torch.equal(actual, expected), f"compiled {actual.flatten().tolist()} != eager {expected.flatten().tolist()}"


if __name__ == "__main__":
    test_pt_175154_nearest_interpolate_unchanged_dim()
