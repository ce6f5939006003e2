"""A negative F.pad that trims a flattened conv + eval BatchNorm2d output: compiled values differ from eager.

issue:    https://github.com/pytorch/pytorch/issues/195582
checks:   compiled `F.pad(bn(conv(x)).flatten(1), (0, 50 - 72))` (Conv2d(1, 8, 2), BatchNorm2d(8) in eval, a
          (1, 1, 4, 4) input, no_grad) equals eager's first 50 values; compiled returns some of them wrong
fails on: 2.13.0+cpu (checked here); the issue: nightly, CPU (values around 1e29-1e34, different on every run)
kind:     wrong values (float)
feature:  inductor lowering (constant_pad_nd with a negative pad of a flattened conv/batch_norm output)
"""

import torch
import torch.nn.functional as F


def trimmed_features(conv: torch.nn.Module, norm: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    flat = norm(conv(x)).flatten(1)
    return F.pad(flat, (0, 50 - flat.shape[-1]))


def test_pt_195582_batchnorm_shrinking_pad() -> None:
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(1, 8, 2)
    norm = torch.nn.BatchNorm2d(8).eval()
    x = torch.randn(1, 1, 4, 4)
    with torch.no_grad():
        expected = trimmed_features(conv, norm, x)
        actual = torch.compile(trimmed_features)(conv, norm, x)
    assert torch.allclose(actual, expected, atol=1e-5), (
        f"compiled differs from eager in {(actual != expected).sum().item()} of {expected.numel()} values, "
        f"max abs diff {(actual - expected).abs().max().item()}"
    )


if __name__ == "__main__":
    test_pt_195582_batchnorm_shrinking_pad()
