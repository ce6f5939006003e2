"""A while_loop whose body reads, through a closure, the tensor it was started with: compiling it fails with
"cond_fn might be aliasing the input or the output".

issue:    https://github.com/pytorch/pytorch/issues/191582
checks:   compiled `while_loop(i < 2, (i + 1, value + x), (tensor(0), x))` returns eager's result; the issue's body
          scatters the closed-over start tensor into a clone of the carry, the same error
fails on: 2.13.0+cpu (checked here); the issue: 2026-07, CPU
kind:     compile error
feature:  higher-order ops (while_loop), aliasing checks of lifted closure inputs
"""

import torch
from torch._higher_order_ops.while_loop import while_loop


def add_start_twice(x: torch.Tensor) -> torch.Tensor:
    def more(i: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        return i < 2

    def step(i: torch.Tensor, value: torch.Tensor):
        return i + 1, value + x  # x: the loop's own starting value, read through the closure

    return while_loop(more, step, (torch.tensor(0), x))[1]


def test_pt_191582_while_loop_closure_of_carry() -> None:
    x = torch.arange(16.0).reshape(4, 4)
    expected = add_start_twice(x)
    actual = torch.compile(add_start_twice)(x)
    assert torch.equal(actual, expected), f"compiled {actual.tolist()} != eager {expected.tolist()}"


if __name__ == "__main__":
    test_pt_191582_while_loop_closure_of_carry()
