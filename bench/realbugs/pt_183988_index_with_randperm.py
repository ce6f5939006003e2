"""Indexing a tensor with torch.randperm(n) under inductor: a pattern-matcher replacement misses an input and fails.

issue:    https://github.com/pytorch/pytorch/issues/183988
checks:   compiled `x[torch.randperm(x.shape[0])]` runs and returns a permutation of x's rows
fails on: 2.13.0+cpu (checked here); the issue: 2.13 nightly (2026-05)
kind:     compile error
feature:  inductor pattern matcher, random ops, advanced indexing
"""

import torch


def shuffle_rows(x: torch.Tensor) -> torch.Tensor:
    return x[torch.randperm(x.shape[0])]


def test_pt_183988_index_with_randperm() -> None:
    x = torch.arange(32.0).reshape(8, 4)
    shuffled = torch.compile(shuffle_rows)(x)
    assert torch.equal(shuffled.sort(dim=0).values, x)


if __name__ == "__main__":
    test_pt_183988_index_with_randperm()
