"""The gradient of atan2(x, y).amin(dim) in float32, compiled: silently different from eager.

issue:    https://github.com/pytorch/pytorch/issues/186799
checks:   x.grad and y.grad of compiled `atan2(x, y).amin(dim=1).sum()` equal eager's
fails on: 2.13.0+cpu (checked here); the issue: 2.12, CPU
kind:     wrong values (float)
feature:  training (backward), inductor reductions (amin with ties)
"""

import torch


def smallest_angle(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.atan2(x, y).amin(dim=1).sum()


def test_pt_186799_atan2_amin_grad() -> None:
    x = torch.tensor([[1.0, 1.0, 2.0], [0.5, -1.0, -1.0]], requires_grad=True)
    y = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], requires_grad=True)
    smallest_angle(x, y).backward()
    expected = (x.grad.clone(), y.grad.clone())
    x.grad = y.grad = None
    torch.compile(smallest_angle)(x, y).backward()
    assert torch.equal(x.grad, expected[0]) and torch.equal(y.grad, expected[1]), (
        f"compiled x.grad {x.grad.tolist()} != eager {expected[0].tolist()}")


if __name__ == "__main__":
    test_pt_186799_atan2_amin_grad()
