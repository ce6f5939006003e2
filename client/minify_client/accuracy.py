"""The accuracy oracle: when a compiled graph's outputs count as wrong. One implementation, used by
the worker (a candidate of an `accuracy` job) and by the capture helper (MINIFY_CAPTURE_ACCURACY=1).

As torch's accuracy minifier judges (`same_two_models` / `backend_accuracy_fails` in
torch/_dynamo/debug_utils.py): forward only, against eager, with an fp64 reference when
`torch._dynamo.config.same_two_models_use_fp64`, `same(ref, res, fp64_ref, tol, equal_nan=True,
ignore_non_fp=not strict)`. torch is imported when a function is called, never at import.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

ACCURACY_EXC_TYPE = "AccuracyError"
DEFAULT_TOLERANCE = 1e-3


class AccuracyError(Exception):
    """A compiled graph's outputs differ from eager beyond the tolerance (the message says how)."""


def without_dtype_asserts(gm: Any) -> Any:
    """A copy of `gm` without its `aten._assert_tensor_metadata` nodes, for the fp64 reference:
    export records there the dtype a tensor had (a `.to(torch.float32)` in the model, as in
    transformers' models), which casting the program to fp64 changes on purpose."""
    copied = copy.deepcopy(gm)
    asserts = [node for node in copied.graph.nodes if node.op == "call_function" and not node.users
               and getattr(node.target, "__name__", "").startswith("_assert_tensor_metadata")]
    for node in asserts:
        copied.graph.erase_node(node)
    if asserts:
        copied.recompile()
    return copied


def fp64_reference(gm: Any, inputs: list[Any]) -> Any:
    """`gm`'s outputs computed in fp64, or None when torch's config says not to use one."""
    import torch._dynamo.config as dynamo_config
    from torch._dynamo.debug_utils import cast_to_fp64

    if not dynamo_config.same_two_models_use_fp64:
        return None
    fp64_model, fp64_inputs = cast_to_fp64(without_dtype_asserts(gm), clone_inputs(inputs))
    return fp64_model(*fp64_inputs)


def divergence(reference: Any, result: Any, fp64: Any, *, tolerance: float = DEFAULT_TOLERANCE,
               strict: bool = False) -> str | None:
    """None when `result` passes for `reference`, else what differs."""
    from torch._dynamo.utils import same

    found: list[str] = []

    def log_error(message: str, *args: Any) -> None:
        found.append(message % args if args else message)

    if same(reference, result, fp64, tol=tolerance, equal_nan=True, ignore_non_fp=not strict, log_error=log_error):
        return None
    return "; ".join(found)[:2000] or "compiled result differs from eager"


def compare_to_eager(gm: Any, inputs: list[Any], run_compiled: Callable[[list[Any]], Any], *,
                     tolerance: float = DEFAULT_TOLERANCE, strict: bool = False) -> str | None:
    """Run `gm` eagerly and `run_compiled` on copies of `inputs`; None when the outputs agree.
    Without an fp64 reference (it could not be computed) a non-strict check passes, as torch's."""
    import torch

    with torch.no_grad():
        reference = gm(*clone_inputs(inputs))
        try:
            fp64 = fp64_reference(gm, inputs)
        except Exception:
            if not strict:
                return None
            fp64 = None
        result = run_compiled(clone_inputs(inputs))
    return divergence(reference, result, fp64, tolerance=tolerance, strict=strict)


def clone_inputs(inputs: list[Any]) -> list[Any]:
    import torch

    return [value.clone() if isinstance(value, torch.Tensor) else value for value in inputs]
