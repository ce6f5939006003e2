"""Inputs the crash-safe capture cannot keep as what they are (capture/crash.py, `check_savable`):
a first run with one runs unguarded, and the warning names the input and why (a tensor subclass).
Views with a conjugate or negative bit, sparse tensors and ZeroTensors (kept as a marker:
test_capture_zero_tensors.py) are kept.
"""

from __future__ import annotations

import pytest
import torch

from minify_client.capture import crash


class Marked(torch.Tensor):
    pass


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
