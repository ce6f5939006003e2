"""ZeroTensor inputs in the files that carry values (inputs.pt, values.pt; issue 38, pytorch#197067).

A ZeroTensor is the zero gradient autograd gives for ops such as `sgn`: a tensor without storage
whose data pointer is null. `torch.save` refuses it ("ZeroTensor is not serializable"), and a dense
zeros tensor in its place would be another program: a compiled kernel that reads the null pointer
is the bug. So the files hold it as a marker, a plain dict that `torch.load(weights_only=True)`
reads like any other (no class to allow, nothing unpickled that was not before):

    {"__minify__": "zero_tensor", "shape": [3], "stride": [1], "dtype": "float32", "device": "cpu"}

and every reader rebuilds it with `torch._efficientzerotensor` (a view's strides with `as_strided`,
which keeps it a ZeroTensor). The capture writes markers (`encode`), the worker's prepare and the
sandbox's value store read them (`decode`), repro.py carries its own copy of `decode` (plain torch).

A ZeroTensor is immutable (an in-place op on it raises), so a copy of one is itself: `clone()` would
give a dense tensor (`accuracy.clone_input`). Conjugate and negative views need no marker: torch.save
keeps their bits and torch.load gives them back; only `clone()` resolves them, which
`accuracy.clone_input` does not.

Torch is imported when a function is called, never at import.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

MARKER_KEY = "__minify__"
MARKER_KIND = "zero_tensor"


def is_zero_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor) and value._is_zerotensor()


def is_marker(value: Any) -> bool:
    return isinstance(value, dict) and value.get(MARKER_KEY) == MARKER_KIND


def to_marker(value: Any) -> dict[str, Any]:
    """The marker of the ZeroTensor `value`: its shape, strides, dtype and device."""
    return {MARKER_KEY: MARKER_KIND, "shape": list(value.shape), "stride": list(value.stride()),
            "dtype": str(value.dtype).removeprefix("torch."), "device": str(value.device)}


def from_marker(marker: dict[str, Any], device: Any = None) -> Any:
    """The ZeroTensor `marker` describes, on `device` (default: the marker's own)."""
    import torch

    dtype = getattr(torch, str(marker["dtype"]), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"a ZeroTensor marker names an unknown dtype {marker['dtype']!r}")
    stride = marker.get("stride")
    return make([int(size) for size in marker["shape"]], None if stride is None else [int(step) for step in stride],
                dtype, device or marker.get("device", "cpu"))


def make(shape: list[int], stride: list[int] | None, dtype: Any, device: Any) -> Any:
    """A ZeroTensor of `shape`, with `stride` (default: contiguous; another through `as_strided`,
    which keeps it a ZeroTensor)."""
    import torch

    zeros = torch._efficientzerotensor(shape, dtype=dtype, device=device)
    return zeros if stride is None or list(zeros.stride()) == stride else zeros.as_strided(shape, stride)


def to_device(value: Any, device: Any) -> Any:
    """`value.to(device)`, but a ZeroTensor stays one: `to` another device (or dtype) makes it dense."""
    if is_zero_tensor(value):
        return value if value.device == _device(device) else from_marker(to_marker(value), device)
    return value.to(device)


def _device(device: Any) -> Any:
    import torch

    return torch.device(device)


def contains(value: Any) -> bool:
    """Whether `value` (a tensor, or tuples, lists and dicts of them) holds a ZeroTensor."""
    return _holds(value, is_zero_tensor)


def encode(value: Any) -> Any:
    """`value` with every ZeroTensor replaced by its marker, ready for torch.save; tuples, lists and
    dicts are walked (a structure without one is returned as it is: the same objects, so that
    torch.save keeps the storages they share)."""
    if not contains(value):
        return value
    if isinstance(value, tuple | list):
        return type(value)(encode(item) for item in value)
    if isinstance(value, dict):
        return {key: encode(item) for key, item in value.items()}
    return to_marker(value)


def decode(value: Any, device: Any = None) -> Any:
    """`value` as torch.load read it, with every marker rebuilt as its ZeroTensor (on `device`)."""
    if is_marker(value):
        return from_marker(value, device)
    if not _holds(value, is_marker):
        return value
    if isinstance(value, tuple | list):
        return type(value)(decode(item, device) for item in value)
    return {key: decode(item, device) for key, item in value.items()}


def _holds(value: Any, leaf: Callable[[Any], bool]) -> bool:
    """Whether `value`, or an item of its tuples, lists and dicts at any depth, is a `leaf`."""
    if leaf(value):
        return True
    if isinstance(value, tuple | list):
        return any(_holds(item, leaf) for item in value)
    if isinstance(value, dict):
        return any(_holds(item, leaf) for item in value.values())
    return False


def elements(value: Any) -> int:
    """The elements `value` holds in memory: none for a ZeroTensor, whatever its shape."""
    return 0 if is_zero_tensor(value) else math.prod(value.shape)


@contextlib.contextmanager
def example_inputs_saved(program: Any) -> Iterator[Any]:
    """`program` (an ExportedProgram) as torch.export.save can write it: where its example inputs
    hold a ZeroTensor, none for the time of the block (the inputs file carries them; the program
    object is given back as it was, so a user's own program is unchanged)."""
    example = getattr(program, "example_inputs", None)
    if example is None or not contains(example):
        yield program
        return
    program.example_inputs = None
    try:
        yield program
    finally:
        program.example_inputs = example


def save_program(program: Any, target: Any) -> None:
    """torch.export.save `program` to `target` (a path or a buffer), example inputs that hold a
    ZeroTensor left out (`example_inputs_saved`)."""
    import torch

    with example_inputs_saved(program) as savable:
        torch.export.save(savable, target)
