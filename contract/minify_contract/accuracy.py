"""The accuracy oracle: when a compiled graph's outputs count as wrong. One implementation, used by
the worker (a candidate of an `accuracy` job), by the capture helper (MINIFY_CAPTURE_ACCURACY=1)
and, copied verbatim beside it, by repro.py. Only the standard library and torch (imported when a
function is called, never at import).

Floating-point outputs are judged as torch's accuracy minifier judges them (`same_two_models` /
`backend_accuracy_fails` in torch/_dynamo/debug_utils.py): forward only, against eager, with an
fp64 reference when `torch._dynamo.config.same_two_models_use_fp64`, `same(ref, res, fp64_ref,
tol, equal_nan=True, ignore_non_fp=not strict)`.

A floating-point output whose size the values decide (`unique`, `unique_consecutive`,
`masked_select`, `nonzero`-indexed selections, compiled under dynamo's
`capture_dynamic_output_shape_ops`) can come back with another shape than eager's, which torch's
rule cannot judge (its `allclose` raises, or broadcasts a size of one). Here the fp64 reference
decides (`size_divergence`): where its shape is eager's, the compiled shape is wrong; where it is
not, eager's own rounding decided the size as much as the compiled code's (pytorch#148859), and the
output passes, as it does without a reference unless strict.

Integer and boolean outputs have no rounding, and torch's `ignore_non_fp` skips them (its strict
mode compares them with the float tolerance): here they are compared exactly, strict or not
(`integer_divergence`). A value passes where it equals eager's, or the fp64 reference's (eager's
own result hinged on rounding there: a comparison or an index of floats that fp64 decides
otherwise). Where an op's integer result is legitimately ambiguous, what it means is compared
instead (`output_rules`, from the graph; checked with eager's intermediate values, computed only
when the values differ):
- the indices of ties (`argmax`, `argmin`, `max`/`min`/`median`/`mode`/`kthvalue` along a dim,
  `sort`, `argsort`, `topk`, `cummax`, `cummin`): an index passes where the value it selects equals
  the value eager's index selects (within the tolerance for floats);
- an unsorted `unique`: its values and counts as multisets, its inverse as a relabelling (one
  label of the compiled result for each label of eager's, and back);
- a last-writer-wins scatter (`scatter` without a reduction, `index_put` without accumulation,
  `index_copy`): positions written more than once, where which write wins is unspecified, are not
  compared.
Each rule applies to the op's output as the graph returns it (through reshapes and copies); an
index used in further computation is compared exactly.

Beyond the forward outputs (issue 38), two more ways a compiled graph is wrong, each its own
failure type so a minimization never drifts from one into another:
- `MissingError`: eager raises and the compiled graph returns a result (a dtype, shape or bounds
  check the compiler dropped). Its message names eager's error, so its signature is keyed by it.
  Eager and compiled both raising is no failure: the program is wrong, not the compiler.
- `GradientError`: the forward outputs agree, the gradients do not. The loss is the sum of every
  floating-point output that requires grad; the gradients of the chosen inputs (`gradient_inputs`)
  are judged by torch's float rule against eager's, with an fp64 reference (`gradient_divergence`).
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

ACCURACY_EXC_TYPE = "AccuracyError"
MISSING_ERROR_EXC_TYPE = "MissingError"
GRADIENT_EXC_TYPE = "GradientError"
DEFAULT_TOLERANCE = 1e-3
# The key of wrong values only the inputs a graph writes into show, its outputs agreeing
# (`written_inputs`): its own signature, so a minimization never drifts into an output's failure.
WRITTEN_INPUTS_ONLY = "written inputs only"
# The key of a graph whose compiled outputs are one tensor where eager's are two (`merged_outputs`),
# the values agreeing: its own signature, as `WRITTEN_INPUTS_ONLY` is.
OUTPUTS_MERGED = "outputs merged"
# The key of wrong values only integer or boolean outputs show (`divergence`'s `output N: ...` parts).
INTEGER_ONLY = "integer outputs only"
# How each keyed failure's detail reads, part by part (the parts "; "-joined): the words of
# `divergence` for an integer output, `written_inputs`, `merged_outputs`.
_KEYED_PARTS = {
    INTEGER_ONLY: re.compile(r"output \d+: "),
    WRITTEN_INPUTS_ONLY: re.compile(r"input \d+ written by the graph: "),
    OUTPUTS_MERGED: re.compile(r"outputs \d+ and \d+ are one tensor compiled"),
}


class AccuracyError(Exception):
    """A compiled graph's outputs differ from eager beyond the tolerance (the message says how)."""


class MissingError(Exception):
    """Eager raises where the compiled graph returns a result (the message names eager's error)."""


class GradientError(Exception):
    """A compiled graph's gradients differ from eager's beyond the tolerance; its outputs agree."""


def missing_error(eager_error: BaseException) -> MissingError:
    """The failure of a compiled graph that returned where eager raised `eager_error`: one line,
    eager's error type and first line, so the signature's key is what eager raised."""
    lines = [line.strip() for line in str(eager_error).splitlines() if line.strip()]
    said = f"{type(eager_error).__name__}: {lines[0]}" if lines else type(eager_error).__name__
    return MissingError(f"eager raises {said[:300]}; the compiled graph returns a result")


def without_dtype_asserts(gm: Any) -> Any:
    """A copy of `gm` without its `aten._assert_tensor_metadata` nodes, for the fp64 reference:
    export records there the dtype a tensor had (a `.to(torch.float32)` in the model, as in
    transformers' models), which casting the program to fp64 changes on purpose."""
    import torch.fx

    copied = copy.deepcopy(gm)
    # A higher-order op's subgraphs too (a cond's branches, an autocast region's body).
    for module in [module for module in copied.modules() if isinstance(module, torch.fx.GraphModule)]:
        asserts = [node for node in module.graph.nodes if is_dtype_assert(node)]
        for node in asserts:
            module.graph.erase_node(node)
        if asserts:
            module.recompile()
    return copied


def is_dtype_assert(node: Any) -> bool:
    """An unused `aten._assert_tensor_metadata` node: the dtype torch.export saw at a `.to()`."""
    return node.op == "call_function" and not node.users \
        and getattr(node.target, "__name__", "").startswith("_assert_tensor_metadata")


def fp64_reference(gm: Any, inputs: list[Any]) -> Any:
    """`gm`'s outputs computed in fp64, or None when torch's config says not to use one."""
    import torch._dynamo.config as dynamo_config

    if not dynamo_config.same_two_models_use_fp64:
        return None
    fp64_model, fp64_inputs = fp64_copy(gm, clone_inputs(inputs))
    return fp64_model(*fp64_inputs)


def fp64_copy(gm: Any, inputs: list[Any]) -> tuple[Any, list[Any]]:
    """torch's `cast_to_fp64` of a copy of `gm` without its dtype asserts (`without_dtype_asserts`),
    the dtype arguments of every graph in it rewritten (a higher-order op's subgraphs too), and of
    a module that is not itself a graph (repro.py's module as written, whose subgraphs are)."""
    import torch
    from torch._dynamo.debug_utils import cast_dtype_args_to_fp64
    from torch.utils._pytree import tree_map

    model = without_dtype_asserts(gm).to(torch.float64)
    for module in model.modules():
        if isinstance(module, torch.fx.GraphModule):
            cast_dtype_args_to_fp64(module)
            if _casts_to_fp64(module):
                module.recompile()
    return model, tree_map(lambda value: value.to(torch.float64)
                           if isinstance(value, torch.Tensor) and value.is_floating_point() else value, inputs)


_FLOAT_METHODS = ("float", "half", "bfloat16")


def _casts_to_fp64(module: Any) -> bool:
    """Rewrite `module`'s explicit casts to a lower float type as casts to fp64 (torch's
    `cast_dtype_args_to_fp64` rewrites `convert_element_type` and `dtype=` of functions only):
    `x.float()`, `x.to(torch.float32)`, `aten.to.dtype(x, torch.float32)`, `aten._to_copy`. Left as
    they are, an output computed after one is not fp64, torch's rule then has no fp64 reference for
    it and, non-strict, passes it whatever it holds (a program that ends in `y.float()`, as mixed
    precision code does, had no accuracy check at all). True when anything changed."""
    import torch

    def lower(value: Any) -> bool:
        return isinstance(value, torch.dtype) and value.is_floating_point and value != torch.float64

    to_ops = {getattr(torch.ops.aten.to, name) for name in ("dtype", "dtype_layout", "device", "other")
              if hasattr(torch.ops.aten.to, name)}
    changed = False
    for node in module.graph.nodes:
        if node.op == "call_method" and node.target in _FLOAT_METHODS:
            node.target = "double"
            changed = True
        elif (node.op == "call_method" and node.target in ("to", "type")) or \
                (node.op == "call_function" and (node.target in to_ops or node.target is torch.Tensor.to)):
            args = tuple(torch.float64 if lower(arg) else arg for arg in node.args)
            kwargs = {key: torch.float64 if key == "dtype" and lower(value) else value
                      for key, value in node.kwargs.items()}
            if args != node.args or kwargs != node.kwargs:
                node.args, node.kwargs, changed = args, kwargs, True
    return changed


def divergence(reference: Any, result: Any, fp64: Any, *, tolerance: float = DEFAULT_TOLERANCE,
               strict: bool = False, gm: Any = None, inputs: Sequence[Any] | None = None) -> str | None:
    """None when `result` passes for `reference`, else what differs: floating-point outputs by
    torch's rule, integer and boolean ones exactly (`integer_divergence`, with the rules of `gm`'s
    ops when the graph and its `inputs` are given)."""
    floats = float_divergence(reference, result, fp64, tolerance=tolerance, strict=strict)
    integers = integer_divergence(reference, result, fp64, tolerance=tolerance, gm=gm, inputs=inputs)
    return described(floats, integers)


def described(floats: str | None, integers: str | None) -> str | None:
    """One detail of what `float_divergence` and `integer_divergence` found; None when neither did."""
    if floats is None and integers is None:
        return None
    return "; ".join(part for part in (floats, integers) if part)[:2000] or "compiled result differs from eager"


def float_divergence(reference: Any, result: Any, fp64: Any, *, tolerance: float = DEFAULT_TOLERANCE,
                     strict: bool = False) -> str | None:
    """None when `result` passes torch's rule (`same`; strict also compares the non-floating
    outputs, with the float tolerance), else what torch's rule logged ("" when it logged nothing)."""
    from torch._dynamo.utils import same

    sizes, reference, result, fp64 = size_divergence(reference, result, fp64, strict=strict)
    if sizes is not None:
        return sizes
    found: list[str] = []

    def log_error(message: str, *args: Any) -> None:
        found.append(message % args if args else message)

    if same(reference, result, fp64, tol=tolerance, equal_nan=True, ignore_non_fp=not strict, log_error=log_error):
        return None
    return "; ".join(found)


def size_divergence(reference: Any, result: Any, fp64: Any, *,
                    strict: bool = False) -> tuple[str | None, Any, Any, Any]:
    """Floating-point outputs of another shape than eager's, judged by the fp64 reference's shape
    (see the module's docstring): what is wrong (None when nothing), and the three results left for
    torch's rule, as leaf lists without the outputs judged here (unchanged when none was)."""
    import torch
    from torch.utils._pytree import tree_leaves

    references, results = tree_leaves(reference), tree_leaves(result)
    if len(references) != len(results):
        return None, reference, result, fp64  # a different number of outputs: torch's rule names it
    fp64s = tree_leaves(fp64) if fp64 is not None else []
    fp64s = fp64s if len(fp64s) == len(references) else [None] * len(references)
    judged, wrong = [], []
    for position, (expected, got, precise) in enumerate(zip(references, results, fp64s, strict=True)):
        if not (isinstance(expected, torch.Tensor) and isinstance(got, torch.Tensor)) \
                or not expected.is_floating_point() or got.shape == expected.shape:
            continue
        judged.append(position)
        # "float output N": "output N: " is how an integer output's part begins (its own signature key)
        said = f"float output {position}: shape {tuple(got.shape)}, eager {tuple(expected.shape)}"
        if isinstance(precise, torch.Tensor):
            if precise.shape == expected.shape:
                wrong.append(f"{said} (the fp64 reference's too)")
        elif strict:
            wrong.append(f"{said} (no fp64 reference)")
    if wrong:
        return "; ".join(wrong), reference, result, fp64
    if not judged:
        return None, reference, result, fp64
    kept = [position for position in range(len(references)) if position not in judged]
    fp64 = [fp64s[position] for position in kept] if all(value is not None for value in fp64s) else None
    return None, [references[position] for position in kept], [results[position] for position in kept], fp64


def integer_divergence(reference: Any, result: Any, fp64: Any = None, *, tolerance: float = DEFAULT_TOLERANCE,
                       gm: Any = None, inputs: Sequence[Any] | None = None) -> str | None:
    """None when every integer and boolean output of `result` passes for `reference` (see the
    module's docstring), else what differs. Outputs are matched in order, as pytree leaves (a
    compiled graph may return a list where eager returns a tuple); a different number of outputs
    is left to torch's rule, which names it."""
    import torch
    from torch.utils._pytree import tree_leaves

    references, results = tree_leaves(reference), tree_leaves(result)
    if len(references) != len(results):
        return None
    fp64s = tree_leaves(fp64) if fp64 is not None else []
    fp64s = fp64s if len(fp64s) == len(references) else [None] * len(references)
    rules = output_rules(gm, len(references)) if gm is not None else [None] * len(references)
    intermediates = _Intermediates(gm, inputs)
    found = []
    for position, (expected, got, precise, rule) in enumerate(zip(references, results, fp64s, rules, strict=True)):
        if isinstance(expected, bool | int) and not isinstance(expected, torch.SymInt):
            if got != expected and got != precise:
                found.append(f"output {position}: {got!r}, eager {expected!r}")
            continue
        if not isinstance(expected, torch.Tensor) or expected.is_floating_point() or expected.is_complex():
            continue
        problem = _tensor_divergence(expected, got, precise, rule, intermediates, tolerance)
        if problem is not None:
            found.append(f"output {position}: {problem}")
    return "; ".join(found) if found else None


def _tensor_divergence(expected: Any, got: Any, precise: Any, rule: Rule | None, intermediates: _Intermediates,
                       tolerance: float) -> str | None:
    import torch

    if not isinstance(got, torch.Tensor):
        return f"{type(got).__name__}, eager a {expected.dtype} tensor"
    if got.dtype != expected.dtype:
        return f"dtype {got.dtype}, eager {expected.dtype}"
    got = got.detach().to(expected.device)
    if rule is not None and rule.kind == "unique":
        return _unique_divergence(expected, got, rule)
    if got.shape != expected.shape:
        return f"shape {tuple(got.shape)}, eager {tuple(expected.shape)}"
    agrees = got == expected
    if isinstance(precise, torch.Tensor) and precise.shape == expected.shape and precise.dtype == expected.dtype:
        agrees |= got == precise.to(got.device)
    if bool(agrees.all()):
        return None
    if rule is not None:
        agrees |= rule.accepted(expected, got, intermediates, tolerance)
    wrong = int((~agrees).sum())
    if wrong == 0:
        return None
    first = tuple(int(index) for index in (~agrees).nonzero()[0])
    return (f"{wrong} of {expected.numel()} {str(expected.dtype).removeprefix('torch.')} values differ from eager "
            f"(exactly compared), first at {list(first)}: {got[first].item()!r}, eager {expected[first].item()!r}")


def _unique_divergence(expected: Any, got: Any, rule: Rule) -> str | None:
    """An unsorted `unique`'s output: values and counts as multisets, the inverse as a relabelling."""
    import torch

    if rule.output == 1:
        if got.shape != expected.shape:
            return f"shape {tuple(got.shape)}, eager {tuple(expected.shape)}"
        pairs = torch.stack([expected.reshape(-1), got.reshape(-1)]).unique(dim=1)
        if pairs.shape[1] == expected.unique().numel() == got.unique().numel():
            return None
        return "the inverse of an unsorted unique is not a relabelling of eager's"
    if got.numel() == expected.numel() and torch.equal(got.reshape(-1).sort().values,
                                                       expected.reshape(-1).sort().values):
        return None
    return "an unsorted unique's " + ("counts" if rule.output == 2 else "values") + " differ from eager's as multisets"


def compare_to_eager(gm: Any, inputs: list[Any], run_compiled: Callable[[list[Any]], Any], *,
                     tolerance: float = DEFAULT_TOLERANCE, strict: bool = False) -> str | None:
    """Run `gm` eagerly and `run_compiled` on copies of `inputs`; None when the outputs agree.
    Without an fp64 reference (it could not be computed) a non-strict check passes, as torch's."""
    import torch

    with torch.no_grad():
        eager_inputs = clone_inputs(inputs)
        reference = gm(*eager_inputs)
        try:
            fp64 = fp64_reference(gm, inputs)
        except Exception:
            if not strict:
                return None
            fp64 = None
        compiled_inputs = clone_inputs(inputs)
        result = run_compiled(compiled_inputs)
        found = divergence(reference, result, fp64, tolerance=tolerance, strict=strict, gm=gm, inputs=inputs)
        return (found or written_inputs(inputs, eager_inputs, compiled_inputs, tolerance=tolerance)
                or merged_outputs(reference, result))


def gradient_inputs(inputs: Sequence[Any], *, requiring_grad_only: bool) -> list[int]:
    """The positions of the floating-point tensor inputs whose gradients are judged: those that
    require grad (the capture: what the user's program differentiates), or all of them (the
    worker, whose inputs come from a file that keeps no `requires_grad`)."""
    import torch

    return [position for position, value in enumerate(inputs)
            if isinstance(value, torch.Tensor) and value.is_floating_point()
            and (value.requires_grad or not requiring_grad_only)]


def gradients(run: Callable[..., Any], inputs: Sequence[Any], positions: Sequence[int]) -> list[Any] | None:
    """The gradients of the inputs at `positions` of the sum of `run(*inputs)`'s floating-point
    outputs that require grad (on copies of the inputs; zeros for an input the loss does not use);
    None when no output requires grad."""
    import torch
    from torch.utils._pytree import tree_leaves

    with torch.enable_grad():
        args = [value.detach().clone().requires_grad_(position in positions) if isinstance(value, torch.Tensor)
                else value for position, value in enumerate(inputs)]
        outputs = [value for value in tree_leaves(run(*args))
                   if isinstance(value, torch.Tensor) and value.requires_grad and value.is_floating_point()]
        if not outputs:
            return None
        loss = sum(output.sum() for output in outputs)
        with autocast_off():
            found = torch.autograd.grad(loss, [args[position] for position in positions], allow_unused=True,
                                        materialize_grads=True)
    return [gradient.detach() for gradient in found]


def autocast_off() -> contextlib.ExitStack:
    """Autocast off, for a backward: a program takes its gradients after the autocast region its
    forward ran in (torch's advice: the engine's backward ops are cast otherwise, eager's too). A
    check at a compiled forward's first call runs inside the region (pytorch#179804)."""
    import torch

    stack = contextlib.ExitStack()
    for device in ("cpu", "cuda"):
        if torch.is_autocast_enabled(device):
            stack.enter_context(torch.autocast(device, enabled=False))
    return stack


def autocast_region(autocast: Any) -> contextlib.AbstractContextManager[Any]:
    """`torch.autocast` as a job spec's `autocast` says (its `device` and `dtype`), or no region
    where it is None."""
    import torch

    if autocast is None:
        return contextlib.nullcontext()
    return torch.autocast(autocast.device, dtype=getattr(torch, autocast.dtype))


def gradient_divergence(gm: Any, inputs: list[Any], run_compiled: Callable[..., Any], positions: Sequence[int], *,
                        tolerance: float = DEFAULT_TOLERANCE, strict: bool = False) -> str | None:
    """None when the compiled gradients of the inputs at `positions` pass for eager's (torch's float
    rule, with gradients computed in fp64 as the reference), else what differs. Without an fp64
    reference a non-strict check passes, as the forward one does."""
    if not positions:
        return None
    reference = gradients(gm, inputs, positions)
    if reference is None:
        return None
    try:
        fp64_model, fp64_inputs = fp64_copy(gm, clone_inputs(inputs))
        fp64 = gradients(fp64_model, fp64_inputs, positions)
    except Exception:
        if not strict:
            return None
        fp64 = None
    result = gradients(run_compiled, inputs, positions)
    if result is None:
        return "the compiled graph's outputs do not require grad; eager's do"
    found = float_divergence(tuple(reference), tuple(result), tuple(fp64) if fp64 is not None else None,
                             tolerance=tolerance, strict=strict)
    if found is None:
        return None
    worst = max(range(len(reference)), key=lambda i: _distance(reference[i], result[i]))
    said = (f"gradient of input {positions[worst]} differs from eager's: compiled {_short(result[worst])}, "
            f"eager {_short(reference[worst])}")
    return (said + (f" ({found})" if found else ""))[:2000]


def _distance(expected: Any, got: Any) -> float:
    if expected.shape != got.shape or not expected.numel():
        return float("inf") if expected.shape != got.shape else 0.0
    return float((expected.double() - got.double()).abs().nan_to_num(float("inf")).max())


def beyond_tolerance(reference: Any, result: Any, *, tolerance: float = DEFAULT_TOLERANCE) -> str | None:
    """What of `result`'s floating-point outputs differs from eager's `reference` beyond `tolerance`
    elementwise, by whole units (None when all are within it, or differ otherwise): said where
    torch's rule passed them anyway, because they are no further from the fp64 reference than
    eager's own (pytorch#145466: a `floor` of a `cos` the compiled code computes closer to the
    truth lands on the other integer)."""
    import torch
    from torch.utils._pytree import tree_leaves

    for position, (expected, got) in enumerate(zip(tree_leaves(reference), tree_leaves(result), strict=False)):
        if not (isinstance(expected, torch.Tensor) and isinstance(got, torch.Tensor)) \
                or not expected.is_floating_point() or expected.shape != got.shape or expected.dtype != got.dtype:
            continue
        got, expected = got.detach(), expected.detach()
        far = ~torch.isclose(got, expected, rtol=tolerance, atol=tolerance, equal_nan=True)
        # In whole units only (a floor, a round, a comparison of a rounded value), not the noise of
        # random ops, which draw other numbers compiled.
        whole = bool((got[far] == got[far].round()).all()) and bool((expected[far] == expected[far].round()).all())
        if bool(far.any()) and whole:
            first = tuple(int(index) for index in far.nonzero()[0])
            most = float((got.double() - expected.double()).abs()[far].max())
            return (f"output {position}: {int(far.sum())} of {expected.numel()} "
                    f"{str(expected.dtype).removeprefix('torch.')} values differ from eager by up to {most:.4g}, "
                    f"first at {list(first)}: {got[first].item()!r}, eager {expected[first].item()!r}")
    return None


def compile_for_training(backend: str, gm: Any, inputs: Sequence[Any]) -> Any:
    """`gm` compiled by `backend` (as a job spec names it: "inductor", a registered name, or
    "module:callable") in grad mode, as torch.compile compiles a training step."""
    import importlib

    import torch

    with torch.enable_grad():
        if backend == "inductor":
            from torch._inductor.compile_fx import compile_fx

            return compile_fx(gm, list(inputs))
        if ":" in backend:
            module, attribute = backend.split(":", 1)
            return getattr(importlib.import_module(module), attribute)(gm, list(inputs))
        return torch._dynamo.lookup_backend(backend)(gm, list(inputs))


def check_gradients(gm: Any, inputs: list[Any], backend: str, *, tolerance: float = DEFAULT_TOLERANCE,
                    strict: bool = False) -> None:
    """repro.py's gradient check: `gm` compiled by `backend` for training (every floating-point input
    requiring grad), its gradients against eager's; raises `GradientError` when they differ."""
    positions = gradient_inputs(inputs, requiring_grad_only=False)
    args = [value.detach().clone().requires_grad_(True) if position in positions else value
            for position, value in enumerate(inputs)]
    compiled = compile_for_training(backend, gm, args)
    detail = gradient_divergence(gm, inputs, compiled, positions, tolerance=tolerance, strict=strict)
    if detail is not None:
        raise GradientError(detail)


def _short(value: Any) -> str:
    flat = value.detach().reshape(-1)
    shown = ", ".join(f"{float(item):.4g}" for item in flat[:6])
    return f"[{shown}{', ...' if flat.numel() > 6 else ''}]"


def clone_inputs(inputs: list[Any]) -> list[Any]:
    """Copies of `inputs` that alias as they do: tensors sharing a storage (`base` and `base[1:]`)
    become views of one copy of it, with their sizes, strides and offsets, so a graph that writes
    into one input and reads another sees, on the copies, what it saw on the originals (AOT
    autograd compiles such inputs through a synthetic base: pytorch#198095). Other tensors are
    copied one by one (`clone_input`: a ZeroTensor, a conjugate or a negative view stays one)."""
    import torch

    shared = _shared_storages(inputs)
    copies = {key: None for key in shared}
    bases: dict[tuple[Any, int, Any], Any] = {}
    # A tensor that is its whole storage is the base of the others (as `base` of `base[1:]`), else
    # a flat one over the storage: the others are real views of it (`_base` set). AOT autograd
    # replays an aliased output's views from the base, and tensors that only share a storage (as
    # torch.load gives them back) make it fail otherwise (pytorch#198095's graph raises an
    # AssertionError in gen_alias_from_base instead of returning wrong values).
    for value in sorted((value for value in inputs if _storage_key(value) in shared), key=_whole, reverse=True):
        key = _storage_key(value)
        if copies[key] is None:
            copies[key] = value.untyped_storage().clone()
        if (*key, value.dtype) not in bases:
            shape, stride = (value.shape, value.stride()) if _whole(value) else \
                ((copies[key].nbytes() // value.element_size(),), (1,))
            with torch.no_grad():
                bases[(*key, value.dtype)] = torch.empty(0, dtype=value.dtype, device=value.device).set_(
                    copies[key], 0, shape, stride)
    cloned: list[Any] = []
    for value in inputs:
        key = _storage_key(value)
        if key is None or key not in shared:
            cloned.append(clone_input(value) if isinstance(value, torch.Tensor) else value)
            continue
        base = bases[(*key, value.dtype)]
        same = _whole(value) and base.shape == value.shape and base.stride() == value.stride()
        copy_ = _with_bits_of(value, base if same else base.as_strided(value.shape, value.stride(),
                                                                        value.storage_offset()))
        cloned.append(copy_.requires_grad_(True) if value.requires_grad else copy_)
    return cloned


def clone_input(value: Any) -> Any:
    """A copy of the tensor `value` that is what the program received: `clone()`, which makes a
    ZeroTensor dense (it has no storage: the zero gradient of `sgn`, pytorch#197067) and resolves a
    conjugate or negative view's bit, so the compiled code would get another input. A ZeroTensor is
    immutable and is its own copy; a view with the conjugate or negative bit is the same view of a
    clone of what it views."""
    import torch

    if value._is_zerotensor():
        return value
    conj, neg = value.is_conj(), value.is_neg()
    if not (conj or neg):
        return value.clone()
    base = value.conj() if conj else value  # the bits cleared: views of the same memory
    base = torch._neg_view(base) if neg else base
    return _with_bits_of(value, base.clone())


def _with_bits_of(value: Any, plain: Any) -> Any:
    """`plain` (a tensor without the bits) as the view `value` is: with its conjugate and
    negative bits, over the same memory."""
    import torch

    plain = torch._neg_view(plain) if value.is_neg() else plain
    return plain.conj() if value.is_conj() else plain


def _whole(value: Any) -> bool:
    return value.is_contiguous() and value.storage_offset() == 0 \
        and value.numel() * value.element_size() == value.untyped_storage().nbytes()


def aliased_inputs(inputs: Sequence[Any]) -> list[list[int]]:
    """The positions of the tensors of `inputs` that share a storage, one group per storage."""
    groups: dict[tuple[Any, int], list[int]] = {}
    for position, value in enumerate(inputs):
        key = _storage_key(value)
        if key is not None:
            groups.setdefault(key, []).append(position)
    return [positions for positions in groups.values() if len(positions) > 1]


def _shared_storages(inputs: Sequence[Any]) -> set[tuple[Any, int]]:
    return {_storage_key(inputs[group[0]]) for group in aliased_inputs(inputs)}  # type: ignore[misc]


def _storage_key(value: Any) -> tuple[Any, int] | None:
    """What identifies `value`'s storage, for a plain strided tensor with one; None otherwise
    (not a tensor, a subclass, sparse, a ZeroTensor, or an empty storage)."""
    import torch

    if type(value) not in (torch.Tensor, torch.nn.Parameter) or value.layout != torch.strided \
            or value.device.type == "meta" or value._is_zerotensor():  # a ZeroTensor has no storage
        return None
    pointer = value.untyped_storage().data_ptr()
    return (value.device, pointer) if pointer else None


def written_inputs(before: Sequence[Any], eager: Sequence[Any], compiled: Sequence[Any], *,
                   tolerance: float = DEFAULT_TOLERANCE) -> str | None:
    """None when every input a run wrote into (changed from `before`) holds, after the compiled
    run, what it holds after eager's run of the same graph, else what differs (`input N written
    by the graph: ...`): a wrong write-back of an input mutation, or a write through a wrong view,
    is wrong values as much as a wrong output is. Floats by torch's rule with eager's own values as
    the reference (torch's `same` passes anything without one), others exactly."""
    import torch

    found: list[str] = []
    for position, (original, expected, got) in enumerate(zip(before, eager, compiled, strict=True)):
        if not isinstance(original, torch.Tensor) or not isinstance(expected, torch.Tensor):
            continue
        with torch.no_grad():
            if torch.equal(original, expected) and torch.equal(original, got):
                continue
            floats = float_divergence([expected], [got], [expected.to(torch.float64)], tolerance=tolerance) \
                if expected.is_floating_point() else None
            exact = expected.is_floating_point() or torch.equal(expected, got)
        if floats is not None or not exact:
            found.append(f"input {position} written by the graph: {_short(expected)} after eager, "
                         f"{_short(got)} compiled")
    return "; ".join(found) or None


def detail_key(detail: str) -> str:
    """The key of the wrong values an `AccuracyError`'s `detail` describes, as the worker keys
    them: `INTEGER_ONLY`, `WRITTEN_INPUTS_ONLY` or `OUTPUTS_MERGED` where every part of it is of
    that one kind, else "" (floating-point outputs, or kinds mixed). The capture signs its
    failures by it (`fidelity.accuracy_signature`), and so does repro.py (this module beside it)."""
    parts = [part.strip() for part in detail.split("; ") if part.strip()]
    for key, part in _KEYED_PARTS.items():
        if parts and all(part.match(each) for each in parts):
            return key
    return ""


def merged_outputs(reference: Any, result: Any) -> str | None:
    """None unless the compiled graph returned one tensor object at two output positions where
    eager returned two (`outputs 0 and 1 are one tensor compiled, two eager`). Their values agree,
    but what the program then does to one changes the other, which eager's do not share as
    objects: pytorch#191449's graph returned an intermediate and a view of it, inductor returned
    the intermediate twice, and the program's `resize_` of the view grew the intermediate too
    (12 elements where eager's result has 1), in eager code after the graph, where no graph's
    values show it."""
    import torch
    from torch.utils._pytree import tree_leaves

    expected, got = tree_leaves(reference), tree_leaves(result)
    if len(expected) != len(got):
        return None
    found = []
    for later in range(len(got)):
        for earlier in range(later):
            if (isinstance(got[later], torch.Tensor) and got[earlier] is got[later]
                    and expected[earlier] is not expected[later]):
                found.append(f"outputs {earlier} and {later} are one tensor compiled, two eager")
                break
    return "; ".join(found) or None


# ---------------------------------------------------------------------------------------------
# What an op's integer output means: the rules for ambiguous ones

# Ops whose indices select among ties: where their dim is (position, default), whether they keep
# the reduced dim (or a keepdim position), and which output holds the indices (None: the op's own).
_TIE_OPS: dict[str, tuple[int, int | None, int | bool, int | None]] = {
    "argmax": (1, None, 2, None), "argmin": (1, None, 2, None),
    "max": (1, None, 2, 1), "min": (1, None, 2, 1), "median": (1, None, 2, 1), "nanmedian": (1, None, 2, 1),
    "mode": (1, -1, 2, 1), "kthvalue": (2, -1, 3, 1),
    "sort": (1, -1, True, 1), "argsort": (1, -1, True, None), "topk": (2, -1, True, 1),
    "cummax": (1, None, True, 1), "cummin": (1, None, True, 1),
}
_UNIQUE_OPS = ("unique", "_unique2", "_unique")
# Scatters where the last write to a position wins: which one is unspecified when several write it.
_SCATTER_OPS = ("scatter", "scatter_", "index_put", "index_put_", "_unsafe_index_put", "index_copy", "index_copy_")
# The named outputs (torch.return_types) of the ops above.
_FIELDS = {"values": 0, "indices": 1}
# Ops an output may pass through and still be the op's result, its elements in the same order.
_SAME_ORDER = ("clone", "contiguous", "alias", "detach", "view", "_unsafe_view", "reshape", "flatten",
               "squeeze", "unsqueeze", "lift_fresh_copy")


@dataclass(frozen=True)
class Rule:
    """How one integer output is compared: `kind` "ties" (indices of `node`), "unique" (output
    `output` of an unsorted unique) or "scatter" (the result of a last-writer-wins scatter `node`)."""

    kind: str
    node: Any  # torch.fx.Node: the op that made the output
    output: int = 0
    dim: int | None = None
    keeps_dim: bool = True

    def accepted(self, expected: Any, got: Any, intermediates: _Intermediates, tolerance: float) -> Any:
        """Where `got` differs from `expected` but means the same (a bool tensor of their shape)."""
        import torch

        try:
            if self.kind == "ties":
                return self._ties(expected, got, intermediates, tolerance)
            if self.kind == "scatter":
                return self._written_more_than_once(intermediates).reshape(expected.shape)
        except (RuntimeError, IndexError, ValueError, TypeError):  # an index out of range: not the same
            pass
        return torch.zeros_like(expected, dtype=torch.bool)

    def _ties(self, expected: Any, got: Any, intermediates: _Intermediates, tolerance: float) -> Any:
        import torch

        (values,) = intermediates.arguments(self.node, 0)
        shape = intermediates.shape(self.node, self.output)
        picked_by_eager = _select(values, expected.reshape(shape), self.dim, self.keeps_dim)
        picked = _select(values, got.reshape(shape), self.dim, self.keeps_dim)
        if values.is_floating_point() or values.is_complex():
            same = torch.isclose(picked, picked_by_eager, rtol=tolerance, atol=tolerance, equal_nan=True)
        else:
            same = picked == picked_by_eager
        return same.reshape(expected.shape)

    def _written_more_than_once(self, intermediates: _Intermediates) -> Any:
        import torch

        name = _op_name(self.node)
        if name.startswith("scatter"):
            target, dim, index = intermediates.arguments(self.node, 0, 1, 2)
            counts = torch.zeros(target.shape, dtype=torch.int64, device=target.device)
            return counts.scatter_add(dim, index, torch.ones_like(index, dtype=torch.int64)) > 1
        if name.startswith("index_copy"):
            target, dim, index, source = intermediates.arguments(self.node, 0, 1, 2, 3)
            counts = torch.zeros(target.shape, dtype=torch.int64, device=target.device)
            return counts.index_add(dim, index, torch.ones(source.shape, dtype=torch.int64, device=target.device)) > 1
        target, indices = intermediates.arguments(self.node, 0, 1)
        counts = torch.zeros(target.shape, dtype=torch.int64, device=target.device)
        one = torch.ones((), dtype=torch.int64, device=target.device)
        return counts.index_put(tuple(indices), one, accumulate=True) > 1


def _select(values: Any, indices: Any, dim: int | None, keeps_dim: bool) -> Any:
    """The elements of `values` that `indices` pick along `dim` (None: of the flattened tensor)."""
    if dim is None:
        return values.reshape(-1)[indices.reshape(-1)].reshape(indices.shape)
    if values.dim() == 0:
        return values.expand(indices.shape)
    dim = dim % values.dim()
    return values.gather(dim, indices if keeps_dim else indices.unsqueeze(dim))


def output_rules(gm: Any, count: int) -> list[Rule | None]:
    """The rule of each of `gm`'s `count` outputs (None: compared exactly); none when its output
    node does not hold `count` values one for one, or `gm` is not a graph (repro.py's module as
    written)."""
    from torch.utils._pytree import tree_leaves

    graph = getattr(gm, "graph", None)
    output = next((node for node in graph.nodes if node.op == "output"), None) if graph is not None else None
    leaves = tree_leaves(output.args[0]) if output is not None and output.args else []
    if len(leaves) != count:
        return [None] * count
    return [_rule_of(leaf) for leaf in leaves]


def _rule_of(value: Any) -> Rule | None:
    import operator

    import torch.fx as fx

    node = value
    while isinstance(node, fx.Node) and _op_name(node) in _SAME_ORDER:
        node = node.args[0] if node.args else None
    if not isinstance(node, fx.Node):
        return None
    output = None
    if node.op == "call_function" and node.target is operator.getitem and isinstance(node.args[0], fx.Node):
        node, output = node.args[0], node.args[1]
    elif node.op == "call_function" and node.target is getattr and node.args[1] in _FIELDS:  # `.indices`
        node, output = node.args[0], _FIELDS[node.args[1]]
    name = _op_name(node)
    if name in _TIE_OPS:
        dim_at, default, keeps, indices = _TIE_OPS[name]
        if output != indices:
            return None
        dim = _argument(node, dim_at, "dim", default)
        keeps_dim = keeps if isinstance(keeps, bool) else bool(_argument(node, keeps, "keepdim", False))
        if dim is None and name not in ("argmax", "argmin"):
            return None  # max(x), cummax without a dim ...: no indices, or none to compare
        return Rule("ties", node, output or 0, dim, keeps_dim)
    if name in _UNIQUE_OPS and not _argument(node, 1, "sorted", True):
        return Rule("unique", node, _unique_output(node, name, output))
    if name in _SCATTER_OPS and output is None and _last_writer_wins(node, name):
        return Rule("scatter", node)
    return None


def _unique_output(node: Any, name: str, output: int | None) -> int:
    """Which of (values, inverse, counts) output `output` of a unique is: torch.unique returns only
    those it was asked for, aten's _unique2 all three."""
    if output is None or name != "unique":
        return output or 0
    asked = [0, *([1] if _argument(node, 2, "return_inverse", False) else []),
             *([2] if _argument(node, 3, "return_counts", False) else [])]
    return asked[output] if output < len(asked) else 0


def _last_writer_wins(node: Any, name: str) -> bool:
    if name.startswith("scatter"):
        return _argument(node, 4, "reduce", None) is None
    if name.startswith("index_put") or name == "_unsafe_index_put":
        return not _argument(node, 3, "accumulate", False)
    return True


def _op_name(node: Any) -> str:
    """An op's name whatever form the graph has: `argmax` for `aten.argmax.default`, `torch.argmax`
    and the method `x.argmax()`."""
    if node.op == "call_method":
        return str(node.target)
    if node.op != "call_function":
        return ""
    packet = getattr(node.target, "overloadpacket", None)
    return getattr(packet if packet is not None else node.target, "__name__", "")


def _argument(node: Any, position: int, keyword: str, default: Any) -> Any:
    if keyword in node.kwargs:
        return node.kwargs[keyword]
    return node.args[position] if len(node.args) > position else default


class _Intermediates:
    """The eager values of a graph's nodes, computed at the first question (one interpreted run)."""

    def __init__(self, gm: Any, inputs: Sequence[Any] | None) -> None:
        self._gm, self._inputs = gm, inputs
        self._values: dict[Any, Any] | None = None

    def arguments(self, node: Any, *positions: int) -> list[Any]:
        values = self._run()
        arguments = [node.args[position] if len(node.args) > position else None for position in positions]
        return [_resolved(argument, values) for argument in arguments]

    def shape(self, node: Any, output: int) -> Any:
        value = self._run()[node]
        return (value[output] if isinstance(value, tuple | list) else value).shape

    def _run(self) -> dict[Any, Any]:
        import torch
        import torch.fx as fx

        if self._values is None:
            if self._gm is None or self._inputs is None:
                raise ValueError("no graph to compute intermediate values with")
            by_name: dict[str, Any] = {}

            class Recording(fx.Interpreter):
                def run_node(self, node: fx.Node) -> Any:
                    by_name[node.name] = super().run_node(node)
                    return by_name[node.name]

            with torch.no_grad():  # on a copy, as the reference runs: a graph may write into its buffers
                Recording(copy.deepcopy(self._gm)).run(*clone_inputs(list(self._inputs)))
            self._values = {node: by_name[node.name] for node in self._gm.graph.nodes if node.name in by_name}
        return self._values


def _resolved(argument: Any, values: dict[Any, Any]) -> Any:
    import torch.fx as fx

    if isinstance(argument, fx.Node):
        return values[argument]
    if isinstance(argument, list | tuple):
        return type(argument)(_resolved(item, values) for item in argument)
    return argument
