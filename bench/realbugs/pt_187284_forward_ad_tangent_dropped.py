"""A compiled function called on a forward-mode AD dual tensor: its output carries no tangent.

issue:    https://github.com/pytorch/pytorch/issues/187284
checks:   inside `forward_ad.dual_level()`, the tangent of compiled `(x ** 2).sum()` at x = [0.1, 0.2, 0.3] with
          tangent ones equals eager's 1.2 (compiled: None)
fails on: 2.13.0+cpu (checked here); the issue: 2026-06, inductor (the cudagraphs backend keeps it)
kind:     wrong values (float)
feature:  dynamo / AOT autograd (forward-mode AD dual tensors as inputs)
"""

import torch
import torch.autograd.forward_ad as fwAD


def squared_norm(x: torch.Tensor) -> torch.Tensor:
    return (x**2).sum()


def tangent_of(fn) -> torch.Tensor | None:
    with fwAD.dual_level():
        dual = fwAD.make_dual(torch.tensor([0.1, 0.2, 0.3]), torch.ones(3))
        return fwAD.unpack_dual(fn(dual)).tangent


def test_pt_187284_forward_ad_tangent_dropped() -> None:
    expected = tangent_of(squared_norm)
    actual = tangent_of(torch.compile(squared_norm))
    assert actual is not None, f"compiled output has no tangent; eager's is {expected.item()}"
    assert torch.allclose(actual, expected), f"compiled {actual.item()} != eager {expected.item()}"


if __name__ == "__main__":
    test_pt_187284_forward_ad_tangent_dropped()
