"""Inputs the crash-safe capture cannot keep as what they are (capture/crash.py, `check_savable`):
a first run with one runs unguarded, and the warning names the input and why (pytorch#197067: a
ZeroTensor, the gradient of sgn, which inductor's kernel reads through a null pointer). Views with
a conjugate or negative bit, sparse and nested tensors are kept.
"""

from __future__ import annotations

import signal
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from minify_client.capture import crash
from tests.support.subprocesses import run_clean


class Marked(torch.Tensor):
    pass


def _zero_tensor() -> torch.Tensor:
    x = torch.randn(3, requires_grad=True)
    return torch.autograd.grad(torch.sgn(x).sum(), x)[0]


def test_a_zero_tensor_input_is_named_as_what_no_capture_can_keep() -> None:
    with pytest.raises(crash.UnsavableInputs, match=r"input 1 is a ZeroTensor .* torch\._efficientzerotensor"):
        crash.check_savable([torch.ones(2), _zero_tensor()])


def test_a_tensor_subclass_input_is_named_with_its_class() -> None:
    with pytest.raises(crash.UnsavableInputs, match=r"input 0 is a tensor subclass \(Marked\)"):
        crash.check_savable([torch.ones(2).as_subclass(Marked)])


@pytest.mark.parametrize("value", [
    torch.randn(3, dtype=torch.complex64).conj(),
    torch.randn(3, dtype=torch.complex64).conj().imag,  # a negative view
    torch.randn(3, 3).to_sparse(),
    torch.nn.Parameter(torch.randn(2)),
    3,
], ids=["conjugate view", "negative view", "sparse", "parameter", "int"])
def test_views_sparse_tensors_parameters_and_numbers_are_kept(value: object) -> None:
    crash.check_savable([value])


def test_the_runner_says_which_input_it_could_not_guard_and_the_script_dies_as_before(tmp_path: Path) -> None:
    (tmp_path / "script.py").write_text(textwrap.dedent("""
        import torch
        from tests.support import dying_backends
        x = torch.randn(3, requires_grad=True)
        zero_grad = torch.autograd.grad(torch.sgn(x).sum(), x)[0]
        torch.compile(lambda t: torch.relu(t[-1]) + 10, backend=dying_backends.abort_at_run_on_relu)(zero_grad)
    """))
    done = run_clean([sys.executable, "-m", "minify_client.capture", "--crash", "--dir", "caps", "script.py"],
                     tmp_path, timeout_s=600)
    assert done.returncode == -signal.SIGABRT, done.stderr[-3000:]
    assert "cannot guard a compiled graph's first run for crashes (input 0 is a ZeroTensor" in done.stderr
    assert not (tmp_path / "caps" / "captures.json").exists()
