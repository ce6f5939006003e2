"""cumsum of a 0-dim constant tensor made in the compiled function: inductor's scan lowering indexes a missing dim.

issue:    https://github.com/pytorch/pytorch/issues/193263
checks:   compiled `torch.tensor(5.0).cumsum(0)` compiles and returns tensor(5.) as eager does
fails on: 2.13.0+cpu (checked here: IndexError: tuple index out of range); the issue: 2.12.0, CUDA and CPU
kind:     compile error
feature:  inductor scan lowering (cumsum of a 0-dim constant)
"""

import torch


def running_total() -> torch.Tensor:
    return torch.tensor(5.0).cumsum(0)


def test_pt_193263_cumsum_zero_dim_constant() -> None:
    expected = running_total()
    actual = torch.compile(running_total)()
    assert torch.equal(actual, expected), f"compiled {actual} != eager {expected}"


if __name__ == "__main__":
    test_pt_193263_cumsum_zero_dim_constant()
