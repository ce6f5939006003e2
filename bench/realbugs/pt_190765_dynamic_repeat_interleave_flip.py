"""With dynamic=True, flip of repeat_interleave of a flattened computed matrix reads memory it never wrote.

issue:    https://github.com/pytorch/pytorch/issues/190765
checks:   compiled (dynamic=True) `flip(repeat_interleave(flatten(((x @ a).T + (x @ b).T).T), 2), 0)` on small
          float32 matrices equals eager (the compiled result holds garbage, different from run to run)
fails on: 2.13.0+cpu (checked here); the issue: 2026-07, CPU (x86 and aarch64, 2.13.0+cpu among them)
kind:     wrong values (float)
feature:  dynamic shapes (dynamic=True), inductor lowering (repeat_interleave, flip, views of a computed buffer)
"""

import torch


def doubled_reversed(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    z = ((x @ a).t() + (x @ b).t()).t()
    return torch.flip(torch.repeat_interleave(torch.flatten(z), repeats=2), dims=[0])


def test_pt_190765_dynamic_repeat_interleave_flip() -> None:
    x = torch.arange(12.0).reshape(4, 3)
    a = torch.arange(12.0).reshape(3, 4) - 6
    b = torch.ones(3, 4)
    expected = doubled_reversed(x, a, b)
    actual = torch.compile(doubled_reversed, dynamic=True)(x, a, b)
    assert torch.allclose(actual, expected), f"compiled {actual.tolist()} != eager {expected.tolist()}"


if __name__ == "__main__":
    test_pt_190765_dynamic_repeat_interleave_flip()
