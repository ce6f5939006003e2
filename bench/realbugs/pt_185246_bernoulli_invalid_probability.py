"""Bernoulli draws from probabilities outside [0, 1]: eager refuses them, the compiled function samples anyway.

issue:    https://github.com/pytorch/pytorch/issues/185246
checks:   compiled `torch.bernoulli(p)` with p = [1.5, -0.5] raises as eager does ("Expected p_in >= 0 && p_in <= 1")
fails on: 2.13.0+cpu (checked here: returns a tensor); the issue: 2.13 nightly
kind:     missing error
feature:  inductor random ops (bernoulli lowered without its probability check)
"""

import torch


def draw(p: torch.Tensor) -> torch.Tensor:
    return torch.bernoulli(p)


def test_pt_185246_bernoulli_invalid_probability() -> None:
    p = torch.tensor([1.5, -0.5])
    try:
        draw(p)
    except RuntimeError:
        pass
    else:
        raise AssertionError("eager no longer raises: the premise of this case changed")
    try:
        result = torch.compile(draw)(p)
    except RuntimeError:
        return
    raise AssertionError(f"compiled returned {result.tolist()} instead of raising")


if __name__ == "__main__":
    test_pt_185246_bernoulli_invalid_probability()
