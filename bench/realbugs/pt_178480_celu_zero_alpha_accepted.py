"""In-place CELU with alpha=0: eager refuses it, the compiled function (dynamic=True) returns a tensor.

issue:    https://github.com/pytorch/pytorch/issues/178480
checks:   compiled (dynamic=True) `torch.celu_(x, 0.0)` of a float32 (3, 4) tensor raises as eager does
          (RuntimeError: ZeroDivisionError: alpha cannot be 0 for CELU); compiled returns a (3, 4) tensor
fails on: 2.13.0+cpu (checked here); the issue: 2.10.0, CUDA build
kind:     missing error
feature:  decomposition of celu_ (elu with a 1/alpha input scale, without eager's alpha check), dynamic scalar
"""

import torch


def celu_in_place(x: torch.Tensor, alpha: float) -> torch.Tensor:
    return torch.celu_(x, alpha)


def test_pt_178480_celu_zero_alpha_accepted() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    try:
        celu_in_place(x.clone(), 0.0)
    except RuntimeError:
        pass
    else:
        raise AssertionError("eager no longer raises: the premise of this case changed")
    try:
        result = torch.compile(celu_in_place, dynamic=True)(x.clone(), 0.0)
    except RuntimeError:
        return
    raise AssertionError(f"compiled returned a {tuple(result.shape)} tensor instead of raising")


if __name__ == "__main__":
    test_pt_178480_celu_zero_alpha_accepted()
