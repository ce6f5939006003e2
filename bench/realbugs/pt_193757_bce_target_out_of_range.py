"""binary_cross_entropy with a target above 1: eager refuses it, inductor's CPU kernel returns a finite loss.

issue:    https://github.com/pytorch/pytorch/issues/193757
checks:   compiled `binary_cross_entropy(ones, target)` of a float32 (4, 4) target of 1.5 raises as eager
          does (RuntimeError: all elements of target should be between 0 and 1); compiled returns tensor(-50.)
fails on: 2.13.0+cpu (checked here); the issue: 2.13.0 and nightly 2.15, CPU (CUDA asserts in both)
kind:     missing error
feature:  decomposition of binary_cross_entropy (log clamped at -100, without eager's target range check)
"""

import torch
import torch.nn.functional as F


def bce_against_ones(target: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy(torch.ones_like(target), target)


def test_pt_193757_bce_target_out_of_range() -> None:
    target = torch.full((4, 4), 1.5)
    try:
        bce_against_ones(target)
    except RuntimeError:
        pass
    else:
        raise AssertionError("eager no longer raises: the premise of this case changed")
    try:
        result = torch.compile(bce_against_ones)(target)
    except RuntimeError:
        return
    raise AssertionError(f"compiled returned {result!r} instead of raising")


if __name__ == "__main__":
    test_pt_193757_bce_target_out_of_range()
