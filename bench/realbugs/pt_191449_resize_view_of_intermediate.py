"""resize_ of a flat view of an intermediate to 12 elements: eager returns 1 element, compiled returns 12.

issue:    https://github.com/pytorch/pytorch/issues/191449
checks:   compiled `base = x + 1; base.view(-1).resize_(12); return base + 1` on a 1-element x returns eager's
          tensor([2.]) (shape [1]); compiled returns 12 elements, most of them uninitialized memory plus one
fails on: 2.13.0+cpu (checked here); the issue: 2.14 nightly, CUDA and CPU (aot_eager is right, inductor is not)
kind:     wrong values (float)
feature:  dynamo graph break on resize_, inductor aliasing of a graph output whose view was resized
"""

import torch


def grow_view(x: torch.Tensor) -> torch.Tensor:
    base = x + 1
    alias = base.view(-1)
    alias.resize_(12)
    return base + 1


def test_pt_191449_resize_view_of_intermediate() -> None:
    x = torch.zeros(1)
    expected = grow_view(x.clone())
    actual = torch.compile(grow_view)(x.clone())
    assert actual.shape == expected.shape, f"compiled shape {tuple(actual.shape)} != eager {tuple(expected.shape)}"
    assert torch.equal(actual, expected), f"compiled {actual.tolist()} != eager {expected.tolist()}"


if __name__ == "__main__":
    test_pt_191449_resize_view_of_intermediate()
