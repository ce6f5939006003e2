"""Normal(loc in float16, scale in float32).sample(): eager keeps float16, the compiled function returns float32.

issue:    https://github.com/pytorch/pytorch/issues/194547
checks:   compiled `Normal(loc, scale).sample()` has eager's dtype
fails on: 2.13.0+cpu (checked here); the issue: 2.13 (2026-08)
kind:     wrong values (float)
feature:  decompositions (normal sampling), random ops, dtypes
"""

import torch


def draw(loc: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.distributions.Normal(loc, scale).sample()


def test_pt_194547_normal_sample_dtype() -> None:
    loc = torch.zeros(8, dtype=torch.float16)
    scale = torch.ones(8)
    expected = draw(loc, scale)
    actual = torch.compile(draw)(loc, scale)
    assert actual.dtype == expected.dtype, f"compiled {actual.dtype}, eager {expected.dtype}"


if __name__ == "__main__":
    test_pt_194547_normal_sample_dtype()
