"""index_add with a negative index: eager rejects it as out of bounds, the compiled function adds into the last row.

issue:    https://github.com/pytorch/pytorch/issues/185885
checks:   compiled `index_add(zeros(4, 3), 0, tensor([0, -1]), ones(2, 3))` raises as eager does
          ("index -1 is out of bounds for dimension 0 with size 4")
fails on: 2.13.0+cpu (checked here, with and without dynamic=True); the issue: 2026-06, CPU, dynamic=True
kind:     missing error
feature:  inductor decomposition (index_add through index_put drops eager's bounds check)
"""

import torch


def add_rows(x: torch.Tensor, index: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    return torch.index_add(x, 0, index, source)


def test_pt_185885_index_add_negative_index() -> None:
    x, index, source = torch.zeros(4, 3), torch.tensor([0, -1]), torch.ones(2, 3)
    try:
        add_rows(x, index, source)
    except (RuntimeError, IndexError):
        pass
    else:
        raise AssertionError("eager no longer raises: the premise of this case changed")
    try:
        result = torch.compile(add_rows)(x, index, source)
    except (RuntimeError, IndexError):
        return
    raise AssertionError(f"compiled returned {result.tolist()} instead of raising")


if __name__ == "__main__":
    test_pt_185885_index_add_negative_index()
