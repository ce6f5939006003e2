"""Failures no captured graph holds (restated from public PyTorch issues, failing on torch 2.13
CPU), for the diagnosis (capture/diagnose.py), and a test that passes."""

import torch


class Holder:
    def __init__(self) -> None:
        self.left, self.right = object(), object()
        self.current = self.left


def toggle(x: torch.Tensor, holder: Holder) -> torch.Tensor:
    if holder.current is holder.left:
        holder.current = holder.right
        return x + 1
    holder.current = holder.left
    return x - 1


def test_identity_branch_is_replayed() -> None:
    """https://github.com/pytorch/pytorch/issues/196173: dynamo folds `is` on the objects it saw
    while tracing without guarding their identity (dynamo)."""
    x, compiled = torch.zeros(2), torch.compile(toggle, backend="eager")
    eager_holder, compiled_holder = Holder(), Holder()
    eager = [toggle(x, eager_holder).tolist() for _ in range(3)]
    actual = [compiled(x, compiled_holder).tolist() for _ in range(3)]
    assert actual == eager


def bump_base_read_view(t0: torch.Tensor, ta: torch.Tensor) -> torch.Tensor:
    t0.add_(100)
    return ta[0]


def test_aliased_view_rebuilt_from_the_base() -> None:
    """https://github.com/pytorch/pytorch/issues/198095: AOT autograd's runtime wrapper rebuilds a
    view of an input aliasing a mutated one from the wrong base (AOT autograd)."""
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    eager = base.clone()
    expected = bump_base_read_view(eager, eager[1:]).clone()
    compiled = base.clone()
    actual = torch.compile(bump_base_read_view, backend="aot_eager")(compiled, compiled[1:]).clone()
    assert torch.equal(actual, expected)


def test_compiles_and_matches() -> None:
    x = torch.randn(3)
    assert torch.equal(torch.compile(torch.neg, backend="aot_eager")(x), -x)
