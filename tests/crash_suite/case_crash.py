"""A test whose compiled code kills the test process, after one that passes: how it dies is
$CRASH_HOW (abort, segfault or exit; tests.support.dying_backends)."""

import os

import torch

from tests.support import dying_backends

BACKEND = getattr(dying_backends, f"{os.environ.get('CRASH_HOW', 'segfault')}_at_run_on_relu")


def test_compiles_and_runs() -> None:
    torch.compile(torch.sin, backend=BACKEND)(torch.randn(3))


def test_dies_in_compiled_code() -> None:
    torch.compile(lambda x: torch.tanh(torch.relu(x) * 2), backend=BACKEND)(torch.randn(4, 3))
