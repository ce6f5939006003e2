"""cummin of an empty 1-D tensor along a far negative dim: eager returns an empty tensor, inductor's lowering asserts.

issue:    https://github.com/pytorch/pytorch/issues/188224
checks:   compiled `cummin(bartlett_window(0).clone(), dim=-46).values` returns the empty tensor eager returns
fails on: 2.13.0+cpu (checked here); the issue: nightly, CPU
kind:     compile error
feature:  inductor lowering (dim validation of scans), empty tensors
"""

import torch


def running_min() -> torch.Tensor:
    window = torch.bartlett_window(0, periodic=False)  # an empty 1-D tensor
    return torch.cummin(window.clone(), -46).values


def test_pt_188224_cummin_empty_far_dim() -> None:
    expected = running_min()
    actual = torch.compile(running_min)()
    assert torch.equal(actual, expected), f"compiled {actual.tolist()} != eager {expected.tolist()}"


if __name__ == "__main__":
    test_pt_188224_cummin_empty_far_dim()
