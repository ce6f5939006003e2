"""matrix_exp of a grouped 1x1 convolution's output: the compiled function fails at run time on a view of it.

issue:    https://github.com/pytorch/pytorch/issues/188222
checks:   compiled `matrix_exp(conv(sinh(maximum(x, x))))` (Conv2d 8 -> 18 channels, groups=2) runs under no_grad;
          it raises "view size is not compatible with input tensor's size and stride"
fails on: 2.13.0+cpu (checked here); the issue: 2026-06, CPU
kind:     runtime error
feature:  AOT autograd / inductor (strides of a convolution output fed to a decomposed matrix_exp)
"""

import torch


def test_pt_188222_grouped_conv_matrix_exp_view() -> None:
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(8, 18, 1, groups=2, bias=False).eval()

    def exp_of_features(x: torch.Tensor) -> torch.Tensor:
        return torch.matrix_exp(conv(torch.sinh(torch.maximum(x, x))))

    x = torch.rand(3, 8, 8, 8)
    with torch.no_grad():
        expected = exp_of_features(x)
        actual = torch.compile(exp_of_features)(x)
    assert torch.allclose(actual, expected, rtol=1e-4, atol=1e-4)


if __name__ == "__main__":
    test_pt_188222_grouped_conv_matrix_exp_view()
