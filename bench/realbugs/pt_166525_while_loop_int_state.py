"""torch.while_loop whose carried state holds a Python int: inductor's lowering fails on it.

issue:    https://github.com/pytorch/pytorch/issues/166525
checks:   a compiled while_loop counting an int to 3 while accumulating two tensors runs; inductor's lowering
          fails on it as the issue says, with 2.13's words (`AssertionError: A subgraph argument other than
          striding has been modified`) where the issue's torch said `'int' object has no attribute 'meta'`
fails on: 2.13.0+cpu (checked here); the issue: 2.9, CPU
kind:     compile error
feature:  higher-order ops (while_loop)
"""

import torch


class Accumulate(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor):
        def keep_going(i, x, y):
            return i < 3

        def step(i, x, y):
            return i + 1, x + a, y + b

        return torch.while_loop(keep_going, step, (0, torch.zeros_like(a), torch.zeros_like(b)))


def test_pt_166525_while_loop_int_state() -> None:
    torch.compile(Accumulate())(torch.randn(2, 2), torch.randn(2, 2))


if __name__ == "__main__":
    test_pt_166525_while_loop_int_state()
