"""(f) Ten tests that hit one bug: a backend that fails on relu (tests.support.backends), the same
graph each time. One capture, ten test ids in captures.json."""

import pytest
import torch

from tests.support.backends import fail_on_relu


class ReluTanh(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.relu(x) + 1)


@pytest.mark.parametrize("seed", range(10))
def test_same_bug(seed: int) -> None:
    torch.manual_seed(seed)
    torch._dynamo.reset()  # each test compiles afresh, as in separate test files
    torch.compile(ReluTanh(), backend=fail_on_relu)(torch.randn(3, 5))
