"""call_function targets: named ("aten.relu.default", "operator.getitem") and resolved back from an
allowlist (operator, math, a few builtins and torch.sym_*, torch.ops overloads, higher-order ops).
"""

from __future__ import annotations

import builtins
import functools
import math
import operator
from collections.abc import Callable
from typing import Any

import torch

from minify_contract.fx.form import GraphFormatError
from minify_contract.program_json import BUILTIN_NAMES, TORCH_SYM_NAMES


def _python_targets() -> dict[str, Callable[..., Any]]:
    targets: dict[str, Callable[..., Any]] = {}
    for module_name, module in (("operator", operator), ("math", math)):  # program_json.PYTHON_MODULES
        for name in dir(module):
            value = getattr(module, name)
            if not name.startswith("_") and callable(value) and not isinstance(value, type):
                targets[f"{module_name}.{name}"] = value
    for name in BUILTIN_NAMES:
        targets[f"builtins.{name}"] = getattr(builtins, name)
    for name in TORCH_SYM_NAMES:
        if hasattr(torch, name):
            targets[f"torch.{name}"] = getattr(torch, name)
    return targets


_PYTHON_TARGETS = _python_targets()
_PYTHON_TARGET_NAMES = {id(fn): name for name, fn in _PYTHON_TARGETS.items()}


def target_name(target: Any) -> str:
    """Qualified name of a call_function target: "aten.relu.default", "operator.getitem"."""
    name = _PYTHON_TARGET_NAMES.get(id(target))
    if name is not None:
        return name
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return _operator_name(target)
    if isinstance(target, torch._ops.HigherOrderOperator) and target.namespace == "higher_order":
        return f"higher_order.{target.name()}"
    raise GraphFormatError(f"unsupported call_function target {target!r}")


@functools.cache
def _operator_name(target: torch._ops.OpOverload | torch._ops.OpOverloadPacket) -> str:
    return str(target)  # costly (schema parsing), and asked for every node of every hash


def resolve_target(name: str) -> Callable[..., Any]:
    """The callable named by `target_name`; anything outside the allowlist is refused."""
    if name in _PYTHON_TARGETS:
        return _PYTHON_TARGETS[name]
    parts = name.split(".")
    if len(parts) not in (2, 3) or not all(part.isidentifier() for part in parts):
        raise GraphFormatError(f"unknown target {name!r}")
    namespace, *rest = parts
    try:
        resolved: Any = getattr(torch.ops, namespace)
        for part in rest:
            resolved = getattr(resolved, part)
    except (AttributeError, RuntimeError) as error:
        raise GraphFormatError(f"unknown target {name!r}: {error}") from None
    if not isinstance(resolved, (torch._ops.OpOverload, torch._ops.OpOverloadPacket,
                                 torch._ops.HigherOrderOperator)):
        raise GraphFormatError(f"target {name!r} is not an operator overload or higher-order op")
    return resolved
