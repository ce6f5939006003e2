"""Custom ops for the tests, registered when this module is imported, as a user's op library is.

A program that calls them can be loaded only where this module was imported: the worker imports it
in its sandbox when a spec's `op_modules` names it and `MINIFY_ALLOWED_OP_MODULES` allows
`tests.support.custom_ops` (the repo root on PYTHONPATH, as tests/conftest.py puts it).

Two ways of defining an op, since the capture finds their module differently
(`minify_client.capture.custom_ops`): `torch.library.custom_op` (`minify_test::scale`) and a
`Library` with a schema and a kernel (`minify_test::shift`).
"""

from __future__ import annotations

import torch

from tests.support.backends import raise_on

PREFIX = "tests.support.custom_ops"
NAMESPACE = "minify_test"


@torch.library.custom_op("minify_test::scale", mutates_args=())
def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor


@scale.register_fake
def _scale_fake(x: torch.Tensor, factor: float) -> torch.Tensor:
    return torch.empty_like(x)


_library = torch.library.Library(NAMESPACE, "FRAGMENT")
_library.define("shift(Tensor x) -> Tensor")


def _shift(x: torch.Tensor) -> torch.Tensor:
    return x + 1


# CompositeExplicitAutograd serves every device, and meta tensors too (export's fake run).
_library.impl("shift", _shift, "CompositeExplicitAutograd")


class ScaleRelu(torch.nn.Module):
    """sin -> scale -> cos -> relu: a chain with the custom op before the relu."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.cos(scale(torch.sin(x), 2.0)))


class ShiftRelu(torch.nn.Module):
    """shift -> relu: the Library-defined op before the relu."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.ops.minify_test.shift(x))


# A compiler bug in the custom op itself: a backend that fails on any graph that calls `scale`
# (allowed as `tests.support.custom_ops:fail_on_scale` with this module's prefix in MINIFY_ALLOWED_BACKENDS).
fail_on_scale = raise_on("scale")
