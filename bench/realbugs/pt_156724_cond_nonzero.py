"""torch.cond whose branch calls nonzero (a data-dependent output size) fails to compile.

issue:    https://github.com/pytorch/pytorch/issues/156724
checks:   compiled `cond(x.sum() > 0, branch with nonzero, branch with nonzero, (x,))` runs
fails on: 2.13.0+cpu (checked here); the issue: 2.7
kind:     compile error
feature:  higher-order ops (cond), data-dependent shapes
"""

import torch


def count_nonzero_rows(x: torch.Tensor) -> torch.Tensor:
    def positive(x: torch.Tensor) -> torch.Tensor:
        return torch.nonzero(x).sum().reshape(1).float()

    def negative(x: torch.Tensor) -> torch.Tensor:
        return torch.nonzero(-x).sum().reshape(1).float()

    return torch.cond(x.sum() > 0, positive, negative, (x,))


def test_pt_156724_cond_nonzero() -> None:
    torch.compile(count_nonzero_rows)(torch.randn(4, 3))


if __name__ == "__main__":
    test_pt_156724_cond_nonzero()
