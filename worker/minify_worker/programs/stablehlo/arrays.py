"""Arrays between the worlds: MLIR element types, numpy (what jax runs on) and torch (the value
store every sandbox child holds is a `torch.save` of tensors). Sandbox children only.

bfloat16 and the float8 types have no numpy dtype of their own: jax's (`ml_dtypes`) stand in on
the numpy side, and they cross to torch as raw bits of the same width.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .module import tensor_shape

# MLIR element type -> (numpy dtype name, torch dtype name)
ELEMENT_TYPES: dict[str, tuple[str, str]] = {
    "f64": ("float64", "float64"),
    "f32": ("float32", "float32"),
    "f16": ("float16", "float16"),
    "bf16": ("bfloat16", "bfloat16"),
    "f8E4M3FN": ("float8_e4m3fn", "float8_e4m3fn"),
    "f8E5M2": ("float8_e5m2", "float8_e5m2"),
    "i64": ("int64", "int64"),
    "i32": ("int32", "int32"),
    "i16": ("int16", "int16"),
    "i8": ("int8", "int8"),
    "ui8": ("uint8", "uint8"),
    "ui16": ("uint16", "uint16"),
    "ui32": ("uint32", "uint32"),
    "ui64": ("uint64", "uint64"),
    "i1": ("bool", "bool"),
    "complex<f32>": ("complex64", "complex64"),
    "complex<f64>": ("complex128", "complex128"),
}
_BITS = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def numpy_dtype(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))


def shape_of(type_text: str) -> tuple[list[int], np.dtype] | None:
    """The static shape and numpy dtype of a tensor type, None when it has no array value."""
    parsed = tensor_shape(type_text)
    if parsed is None or parsed[1] not in ELEMENT_TYPES:
        return None
    dims, element = parsed
    return dims, numpy_dtype(ELEMENT_TYPES[element][0])


def generated(type_text: str, rng: np.random.Generator) -> np.ndarray:
    """An input for an argument of `type_text`, as the FX loader makes them: standard normal
    floats, integers 0 or 1, all-false booleans."""
    shape = shape_of(type_text)
    if shape is None:
        raise ValueError(f"no value can be made for an argument of type {type_text}")
    dims, dtype = shape
    if dtype == np.bool_:
        return np.zeros(dims, dtype=np.bool_)
    if dtype.kind in "fcV" or dtype.name.startswith(("bfloat", "float8")):
        return rng.standard_normal(dims).astype(dtype)
    return rng.integers(0, 2, dims).astype(dtype)


def to_torch(array: np.ndarray) -> Any:
    import torch

    array = np.asarray(array).copy(order="C")  # (np.ascontiguousarray makes a 0-d array 1-d)
    if array.dtype.name.startswith(("bfloat", "float8")):
        bits = torch.from_numpy(array.view(_BITS[array.dtype.itemsize]).copy())
        return bits.view(getattr(torch, array.dtype.name))
    return torch.from_numpy(array.copy())


def to_numpy(tensor: Any) -> np.ndarray:
    import torch

    tensor = tensor.detach().cpu().contiguous()
    name = str(tensor.dtype).removeprefix("torch.")
    if name.startswith(("bfloat", "float8")):
        return tensor.view(getattr(torch, _BITS[tensor.element_size()])).numpy().view(numpy_dtype(name))
    return tensor.numpy()


def read_npz(path: Path) -> list[np.ndarray]:
    """The arrays of an `.npz`, in argument order: `arg0, arg1, ...` or `arr_0, arr_1, ...`
    (`np.savez(*arrays)`) by number, else in the file's order. Never unpickles."""
    with np.load(path, allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    numbers = {name: _argument_number(name) for name in arrays}
    if sorted(number for number in numbers.values() if number is not None) == list(range(len(arrays))):
        return [arrays[name] for name in sorted(arrays, key=lambda name: numbers[name] or 0)]
    return list(arrays.values())


def _argument_number(name: str) -> int | None:
    """3 for `arg3` or `arr_3`, else None."""
    for prefix in ("arg", "arr_"):
        digits = name.removeprefix(prefix)
        if digits != name and digits.isdigit():
            return int(digits)
    return None
