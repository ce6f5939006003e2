"""Two aliasing inputs, the base mutated, a view of the other returned: AOT autograd rebuilds it from the base.

issue:    https://github.com/pytorch/pytorch/issues/198095
checks:   compiled (aot_eager) `t0.add_(100); return ta[0]` with `ta = t0[1:]` returns row 1 of t0, as eager
fails on: 2.13.0+cpu (checked here); the issue: nightly 2026-09
kind:     wrong values (float)
feature:  AOT autograd runtime wrapper, input mutation and aliasing
"""

import torch


def bump_base_read_view(t0: torch.Tensor, ta: torch.Tensor) -> torch.Tensor:
    t0.add_(100)
    return ta[0]


def test_pt_198095_synthetic_base_view() -> None:
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    eager_base = base.clone()
    expected = bump_base_read_view(eager_base, eager_base[1:]).clone()
    compiled_base = base.clone()
    actual = torch.compile(bump_base_read_view, backend="aot_eager")(compiled_base, compiled_base[1:]).clone()
    assert torch.equal(actual, expected), f"compiled {actual.tolist()} != eager {expected.tolist()}"


if __name__ == "__main__":
    test_pt_198095_synthetic_base_view()
