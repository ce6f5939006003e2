"""A compiled function that mutates an input is reused, without recompiling, for inputs that alias.

issue:    https://github.com/pytorch/pytorch/issues/139789
checks:   `x.mul_(2); return x + y` on two overlapping views of one buffer equals eager after a first
          call on separate tensors
fails on: 2.13.0+cpu (checked here); the issue: 2.6 nightly
kind:     wrong values (float)
feature:  dynamo guards, AOT autograd input mutation and aliasing
"""

import torch


def scale_then_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.mul_(2)
    return x + y


def test_pt_139789_mutation_aliasing_recompile() -> None:
    compiled = torch.compile(scale_then_add, backend="aot_eager")
    compiled(torch.ones(4), torch.ones(4))
    base = torch.ones(8)
    actual = compiled(base[:4], base[2:6])
    eager_base = torch.ones(8)
    expected = scale_then_add(eager_base[:4], eager_base[2:6])
    assert torch.equal(actual, expected), f"compiled {actual.tolist()} != eager {expected.tolist()}"


if __name__ == "__main__":
    test_pt_139789_mutation_aliasing_recompile()
