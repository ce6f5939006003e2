"""Two closures of one factory capturing different Tensor methods: the second reuses the first's graph.

issue:    https://github.com/pytorch/pytorch/issues/197811
checks:   compiled (dynamic=True) closures over `Tensor.__add__` and `Tensor.__mul__` give 9 and 18 on (6, 3)
fails on: 2.13.0+cpu (checked here); the issue: 2.14 nightly (2026-09)
kind:     wrong values (float)
feature:  dynamo guards (closure cells), no graph holds the bug
"""

import torch


def make(op):
    def apply(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return op(x, y)

    return apply


def test_pt_197811_closure_method_descriptor_guard() -> None:
    add, mul = make(torch.Tensor.__add__), make(torch.Tensor.__mul__)
    x, y = torch.tensor(6.0), torch.tensor(3.0)
    expected = (add(x, y), mul(x, y))
    actual = (torch.compile(add, dynamic=True)(x, y), torch.compile(mul, dynamic=True)(x, y))
    assert all(torch.equal(a, e) for a, e in zip(actual, expected, strict=True)), (
        f"compiled {[a.item() for a in actual]} != eager {[e.item() for e in expected]}")


if __name__ == "__main__":
    test_pt_197811_closure_method_descriptor_guard()
