"""A chain where every step adds and multiplies the previous two results: inductor inlines each pointwise op into
both of its users, so the lowering walks a tree that doubles with every step and the compile never finishes.

issue:    https://github.com/pytorch/pytorch/issues/148073
checks:   compiled 22 steps of `(p + q, p * q)` on two 0-d tensors finishes and equals eager (eager: milliseconds)
fails on: 2.13.0+cpu (checked here: 14 steps compile in ~20 s, 17 in ~155 s, each step about doubling; 19 steps
          still lowering after 45 s, in `has_exceeded_max_reads` -> `inner_fn_opcount`); the issue: nightly, CUDA
          (compile time exponential in the chain's length, with backward)
kind:     hang
feature:  inductor lowering (pointwise ops inlined into every user: op count of a doubly-used chain)
"""

import torch

STEPS = 22


def doubling_chain(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    older, newer = a, b
    for _ in range(STEPS):
        older, newer = newer + older, newer * older
    return older + newer


def test_pt_148073_doubling_chain_compile_hang() -> None:
    a = torch.tensor(0.5)
    b = torch.tensor(0.25)
    expected = doubling_chain(a, b)
    actual = torch.compile(doubling_chain)(a, b)  # never returns while the bug is there
    assert torch.allclose(actual, expected), f"compiled {actual} != eager {expected}"


if __name__ == "__main__":
    test_pt_148073_doubling_chain_compile_hang()
