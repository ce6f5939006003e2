"""conv, floor, bilinear upsample, unique_consecutive: the compiled output has a different length than eager's.

issue:    https://github.com/pytorch/pytorch/issues/148859
checks:   compiled module's `unique_consecutive` output has eager's shape and values
fails on: 2.13.0+cpu (checked here); the issue: 2.7 nightly, CPU
kind:     wrong values (float)
feature:  data-dependent output shapes (unique_consecutive), inductor upsample rounding
"""

import torch


class ConvFloorUpsampleUnique(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 3, kernel_size=3, stride=1, padding=1)
        self.upsample = torch.nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.unique_consecutive(self.upsample(torch.floor(self.conv(x))))


def test_pt_148859_unique_consecutive_after_upsample() -> None:
    torch.manual_seed(0)
    model = ConvFloorUpsampleUnique()
    x = torch.randn(1, 1, 16, 16)
    with torch.no_grad():
        expected = model(x)
        actual = torch.compile(model)(x)
    assert actual.shape == expected.shape and torch.allclose(actual, expected), (
        f"compiled {tuple(actual.shape)}, eager {tuple(expected.shape)}")


if __name__ == "__main__":
    test_pt_148859_unique_consecutive_after_upsample()
