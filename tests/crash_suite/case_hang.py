"""A test whose compile never returns, after one that passes (tests.support.backends.hang_on_relu)."""

import torch

from tests.support.backends import hang_on_relu


def test_compiles_and_runs() -> None:
    torch.compile(torch.sin, backend=hang_on_relu)(torch.randn(3))


def test_compile_hangs() -> None:
    torch.compile(lambda x: torch.tanh(torch.relu(x) * 2), backend=hang_on_relu)(torch.randn(4, 3))
