"""margin_ranking_loss on bfloat16 with a float margin: inductor keeps the margin unrounded, so the gradient vanishes.

issue:    https://github.com/pytorch/pytorch/issues/185517
checks:   the gradients of compiled `margin_ranking_loss(x, y, ones, margin=1.7)` on bf16 x = [1.703125] * 2, y = 0
          equal eager's (-0.5 and 0.5): eager rounds 1.7 to bf16's 1.703125 and lands on the clamp's boundary,
          inductor's kernel adds the float 1.7 and gets a zero gradient
fails on: 2.13.0+cpu (checked here); the issue: 2026-05 nightly, CPU only
kind:     wrong values (float)
feature:  training (backward), inductor C++ codegen (scalar constants of bf16 arithmetic), bfloat16
"""

import torch
import torch.nn.functional as F


def ranking_loss(x: torch.Tensor, y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.margin_ranking_loss(x, y, target, margin=1.7)


def input_grads(fn) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.full((2,), 1.703125, dtype=torch.bfloat16, requires_grad=True)
    y = torch.zeros(2, dtype=torch.bfloat16, requires_grad=True)
    fn(x, y, torch.ones(2, dtype=torch.bfloat16)).backward()
    return x.grad, y.grad


def test_pt_185517_margin_ranking_bf16_grad() -> None:
    expected = input_grads(ranking_loss)
    actual = input_grads(torch.compile(ranking_loss))
    for got, want in zip(actual, expected, strict=True):
        assert torch.equal(got, want), f"compiled {got.tolist()} != eager {want.tolist()}"


if __name__ == "__main__":
    test_pt_185517_margin_ranking_bf16_grad()
