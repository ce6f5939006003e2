"""argmax of a bool mask: eager refuses bool input, the compiled function returns an index.

issue:    https://github.com/pytorch/pytorch/issues/198155
checks:   compiled `torch.argmax(x > 0)` of an int64 (2, 3) tensor raises as eager does (RuntimeError:
          argmax(): does not support bool input); compiled returns tensor(0)
fails on: 2.13.0+cpu (checked here); the issue: 2.14.0 and nightly, Linux and Windows (one of 134 operators
          whose decompositions run dtypes their eager kernels reject)
kind:     missing error
feature:  inductor lowering (argmax reduction without eager's dtype check), bool
"""

import torch


def first_positive(x: torch.Tensor) -> torch.Tensor:
    return torch.argmax(x > 0)


def test_pt_198155_argmax_bool_accepted() -> None:
    x = torch.tensor([[1, -2, 3], [4, 0, -6]])
    try:
        first_positive(x)
    except RuntimeError:
        pass
    else:
        raise AssertionError("eager no longer raises: the premise of this case changed")
    try:
        result = torch.compile(first_positive)(x)
    except RuntimeError:
        return
    raise AssertionError(f"compiled returned {result!r} instead of raising")


if __name__ == "__main__":
    test_pt_198155_argmax_bool_accepted()
