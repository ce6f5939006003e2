"""logcumsumexp of a 0-d uint8 tensor: eager has no Byte kernel and raises, the compiled 0-d path returns the input.

issue:    https://github.com/pytorch/pytorch/issues/197807
checks:   compiled `torch.logcumsumexp(tensor(0, uint8), dim=0)` raises NotImplementedError as eager does
          (a 1-D uint8 input is rejected by both; only the 0-d case is lowered to a copy)
fails on: 2.13.0+cpu (checked here: returns tensor(0, dtype=torch.uint8)); the issue: 2.14 nightly
kind:     missing error
feature:  inductor scan lowering (0-d cumulative op lowered to a copy, dtype check dropped)
"""

import torch


def log_running_sum(a: torch.Tensor) -> torch.Tensor:
    return torch.logcumsumexp(a, dim=0)


def test_pt_197807_logcumsumexp_uint8_scalar_accepted() -> None:
    x = torch.tensor(0, dtype=torch.uint8)
    try:
        log_running_sum(x)
    except NotImplementedError:
        pass
    else:
        raise AssertionError("eager no longer raises: the premise of this case changed")
    try:
        result = torch.compile(log_running_sum)(x)
    except NotImplementedError:
        return
    raise AssertionError(f"compiled returned {result!r} instead of raising")


if __name__ == "__main__":
    test_pt_197807_logcumsumexp_uint8_scalar_accepted()
