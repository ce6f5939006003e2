"""Gradient of an antialiased bicubic resize compiled with dynamic=True: tracing its backward hits an internal assert.

issue:    https://github.com/pytorch/pytorch/issues/197622
checks:   compiled (dynamic=True) `F.interpolate(x, size=(n, n), mode="bicubic", antialias=True).sum().backward()`
          on a (1, 2, 6, 6) input with n=7 runs as eager does; compiled raises BackendCompilerFailed (RuntimeError:
          isIntList() INTERNAL ASSERT FAILED, expected IntList but got GenericList)
fails on: 2.13.0+cpu (checked here); the issue: nightly, CUDA (needs bicubic, antialias, a gradient and dynamic=True)
kind:     compile error
feature:  dynamic shapes (symbolic output size), AOT autograd joint graph, meta of _upsample_bicubic2d_aa_backward
"""

import torch
import torch.nn.functional as F


def smooth_resize(image: torch.Tensor, side: int) -> torch.Tensor:
    return F.interpolate(image, size=(side, side), mode="bicubic", align_corners=False, antialias=True)


def test_pt_197622_bicubic_antialias_dynamic_grad() -> None:
    torch.manual_seed(0)
    image = torch.randn(1, 2, 6, 6, requires_grad=True)
    smooth_resize(image, 7).sum().backward()
    expected = image.grad.clone()
    image.grad = None
    torch.compile(smooth_resize, dynamic=True)(image, 7).sum().backward()
    assert torch.allclose(image.grad, expected, atol=1e-5), "compiled gradient differs from eager"


if __name__ == "__main__":
    test_pt_197622_bicubic_antialias_dynamic_grad()
