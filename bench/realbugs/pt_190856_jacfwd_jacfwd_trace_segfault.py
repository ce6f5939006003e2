"""jacfwd of jacfwd of a function using trace(t) * eye(n), compiled: the first call dies with SIGSEGV.

issue:    https://github.com/pytorch/pytorch/issues/190856
checks:   compiled `jacfwd(jacfwd(f))` of `f(t) = mean(1 / (t + trace(t) * eye(3)))` on a float64 3x3 matrix equals
          eager's second derivatives
fails on: 2.13.0+cpu (checked here: SIGSEGV); the issue: 2.11, inductor, SIGSEGV
kind:     crash
feature:  functorch transforms (jacfwd of jacfwd) under torch.compile, inductor C++ kernel
"""

import torch
from torch.func import jacfwd


def spread(t: torch.Tensor) -> torch.Tensor:
    return torch.mean(1.0 / (t + torch.trace(t) * torch.eye(3, dtype=t.dtype)))


def test_pt_190856_jacfwd_jacfwd_trace_segfault() -> None:
    x = torch.tensor([[0.10, 0.20, 0.30], [0.40, 0.50, 0.60], [0.70, 0.80, 0.95]], dtype=torch.float64)
    second = jacfwd(jacfwd(spread))
    expected = second(x)
    actual = torch.compile(second)(x)
    assert torch.allclose(actual, expected)


if __name__ == "__main__":
    test_pt_190856_jacfwd_jacfwd_trace_segfault()
