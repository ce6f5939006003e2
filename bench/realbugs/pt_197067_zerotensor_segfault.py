"""Indexing a ZeroTensor (the gradient of sgn) in a compiled function: the C++ kernel reads a null pointer.

issue:    https://github.com/pytorch/pytorch/issues/197067
checks:   compiled `t[-1] + 10` on a ZeroTensor returns 10 as eager does
fails on: 2.13.0+cpu (checked here); the issue: 2.13 nightly, CPU
kind:     crash
feature:  inductor C++ kernel, tensor subclasses (ZeroTensor)
"""

import torch


def last_plus_ten(t: torch.Tensor) -> torch.Tensor:
    return t[-1] + 10


def test_pt_197067_zerotensor_segfault() -> None:
    x = torch.randn(3, requires_grad=True)
    zero_grad = torch.autograd.grad(torch.sgn(x).sum(), x)[0]  # a ZeroTensor
    expected = last_plus_ten(zero_grad)
    actual = torch.compile(last_plus_ten)(zero_grad)
    assert torch.equal(actual, expected)


if __name__ == "__main__":
    test_pt_197067_zerotensor_segfault()
