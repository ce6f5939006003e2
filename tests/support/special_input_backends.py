"""Test backends that fail only where a run is handed an input that a copy would change: a
ZeroTensor (pytorch#197067's family: the zero gradient of `sgn` has no storage, and inductor's C++
kernel reads its null data pointer), or a view with the conjugate or negative bit (`clone()`
resolves the bit).

Each compiles anything; a graph with relu, when run, reads the first byte of every non-empty tensor
input through its data pointer, as a C++ kernel does (`segfault_on_zero_tensor`,
`raise_on_zero_tensor`): a dense tensor (zeros included) passes, a ZeroTensor's pointer is null; or
raises for an input with the bit set (`raise_on_view_bit`), or returns its result plus one where an
input is a ZeroTensor (`wrong_on_zero_tensor`, an accuracy failure). So these fail only while such an input
is carried as what it is: made dense or resolved anywhere on the way (a capture, a value store, a
copy before a run, a shrink, the repro), the failure is lost. Graphs without relu run eagerly.

Sandbox children import them by path (`tests.support.special_input_backends:segfault_on_zero_tensor`)
when `MINIFY_ALLOWED_BACKENDS` allows this module.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from tests.support.backends import Backend, has_op

MODULE = "tests.support.special_input_backends"


def _null_inputs(args: tuple[Any, ...]) -> list[int]:
    """The positions of the non-empty tensor inputs whose data pointer is null (ZeroTensors)."""
    return [position for position, value in enumerate(args)
            if isinstance(value, torch.Tensor) and value.numel() and value.data_ptr() == 0]


def _bit_inputs(args: tuple[Any, ...]) -> list[int]:
    """The positions of the tensor inputs with the conjugate or negative bit."""
    return [position for position, value in enumerate(args)
            if isinstance(value, torch.Tensor) and (value.is_conj() or value.is_neg())]


def _on_relu(found: Callable[[tuple[Any, ...]], list[int]], on_found: Callable[[int], None]) -> Backend:
    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        reads = has_op(gm, "relu")

        def run(*args: Any) -> Any:
            if reads:
                for position in found(args):
                    on_found(position)
            return gm(*args)

        return run

    return backend


def _segfault(position: int) -> None:
    ctypes.string_at(0)  # the kernel's read of input `position`'s first element: SIGSEGV


def _raise_null(position: int) -> None:
    raise RuntimeError(f"kernel read a null data pointer (input {position})")


def _raise_bit(position: int) -> None:
    raise RuntimeError(f"kernel ignored the conjugate or negative bit of input {position}")


segfault_on_zero_tensor = _on_relu(_null_inputs, _segfault)
raise_on_zero_tensor = _on_relu(_null_inputs, _raise_null)
raise_on_view_bit = _on_relu(_bit_inputs, _raise_bit)


def wrong_on_zero_tensor(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """A relu graph run on a ZeroTensor input returns its floating-point outputs plus one."""
    reads = has_op(gm, "relu")

    def run(*args: Any) -> Any:
        result = gm(*args)
        if not (reads and _null_inputs(args)):
            return result
        wrong = [value + 1 if isinstance(value, torch.Tensor) and value.is_floating_point() else value
                 for value in (result if isinstance(result, tuple | list) else [result])]
        return type(result)(wrong) if isinstance(result, tuple | list) else wrong[0]

    return run
