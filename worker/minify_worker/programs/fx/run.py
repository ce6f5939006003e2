"""Run one candidate inside a sandbox child and classify what happened (docs/internals.md).

`run_wire_candidate` is what a child executes for `SandboxPool.submit`: rebuild the candidate from
its wire form, take its inputs from the value store, compile it with the job's backend, run it,
and return one `Outcome`. Exceptions become values here; only a dead child (a signal, a hang) is
classified by the parent.

- an exception while compiling → `Fails(compile_error)`, while running → `Fails(runtime_error)`;
  with `failure.training` (a capture of a compile that failed in AOT autograd's joint graph) the
  candidate is compiled and run for training: grad mode on, floating-point inputs requiring grad;
- an allocator running out of memory (CUDA or host) → `OutOfMemory`;
- failure kind `accuracy`: the compiled result against eager by `minify_contract.accuracy` (the oracle
  the capture helper shares), the way torch's accuracy minifier does it (`backend_accuracy_fails` /
  `same_two_models` in torch/_dynamo/debug_utils.py, with `ACCURACY_FAILS` of
  torch/_dynamo/repro/after_aot.py): forward only, an fp64 reference when
  `torch._dynamo.config.same_two_models_use_fp64`, `same(ref, res, fp64_ref, tol, equal_nan=True,
  ignore_non_fp=not strict)`, fp64 required unless strict, and integer and boolean outputs compared
  exactly (ties and other ambiguous integer results by what they mean) → `Fails(accuracy, "AccuracyError")`,
  keyed `INTEGER_ONLY` when only integer or boolean outputs differ: a float failure does not drift
  into an integer one a candidate exposes (a boolean intermediate another bug flips), nor back;
  eager raising where the compiled graph returns → `Fails(accuracy, "MissingError")`, keyed by
  eager's error (both raising: `Invalid`, the program's own error); a crash job's candidate that
  raises where eager raises too → `Invalid` likewise (eager may raise in a crash job: the bug is
  the compiled program dying where eager raises a clean error); and, where the job's signature
  is `GradientError` (a capture of a training step whose gradients were wrong), the program is
  compiled for training (every floating-point input requiring grad) and, its outputs agreeing,
  the gradients of the sum of its outputs are judged against eager's with an fp64 reference
  → `Fails(accuracy, "GradientError")`;
- a candidate that cannot be built, or whose eager reference cannot run → `Invalid`.
"""

from __future__ import annotations

import copy
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import fx

from minify_contract import signatures, zero_tensors
from minify_contract.accuracy import (
    ACCURACY_EXC_TYPE,
    GRADIENT_EXC_TYPE,
    OUTPUTS_MERGED,
    WRITTEN_INPUTS_ONLY,
    autocast_region,
    clone_input,
    clone_inputs,
    described,
    float_divergence,
    fp64_reference,
    gradient_divergence,
    gradient_inputs,
    integer_divergence,
    merged_outputs,
    missing_error,
    written_inputs,
)
from minify_contract.models import JobSpec
from minify_worker.outcomes import INTEGER_ONLY, Fails, Invalid, Outcome, Passes, Signature
from minify_worker.programs.classify import EnvironmentFault, environment_fault, failure, repeated
from minify_worker.programs.fx.backends import (
    Backend,
    BackendError,
    apply_inductor_config,
    dynamic_shapes_of,
    for_training,
    resolve_backend,
    run_compiled,
)
from minify_worker.sandbox import warmup, whole_builds

# What the loader and the linker say about a half-written binary: a child killed while its
# compiler wrote into the shared compile cache (a cancelled or timed-out candidate) leaves one.
_DAMAGED_BINARY = re.compile(
    r"(?P<path>/[^\s:'\"]+\.(?:so|o|gch|pch))['\"]?:?\s*(?:[^\n]*?:\s*)?"
    r"(?:file too short|invalid ELF header|cannot read file data|ELF load command|ELF file|"
    r"file truncated|file format not recognized|file not recognized)"
)

log = logging.getLogger(__name__)


def _clone_inputs(inputs: list[Any]) -> list[Any]:
    # Inputs that share a storage stay views of one copy (what AOT autograd does with aliased
    # inputs is part of what the graph computes): `accuracy.clone_inputs`.
    return clone_inputs(inputs)


def _to_device(inputs: list[Any], device: str) -> list[Any]:
    return [zero_tensors.to_device(value, device) if isinstance(value, torch.Tensor) else value for value in inputs]


def _synchronize(device: str) -> None:
    # CUDA errors are asynchronous: make them surface while the candidate is "running".
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def build_candidate(wire_graph: dict[str, Any], values: dict[str, Any]) -> tuple[fx.GraphModule, list[Any]]:
    """The candidate's GraphModule and its inputs, in placeholder order, from the value store
    (a shrunk input sliced to its `minify_narrow` sizes: `shrink.narrowed`; a graph whose ops do
    not fit them, or that raises eagerly on them where it runs on the whole values, is refused:
    `shrink.check_sizes`, `shrink.check_runs`)."""
    from minify_worker.programs.fx.graph import META_NARROW, graph_from_wire, to_graph_module
    from minify_worker.programs.fx.shrink import check_runs, check_sizes, narrowed

    graph = graph_from_wire(wire_graph)
    gm = to_graph_module(graph)
    whole = []
    inputs = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        key = node.meta.get("minify_value", node.name)
        if key not in values:
            raise KeyError(f"input {node.name!r} has no value {key!r} in the value store")
        whole.append(values[key])
        inputs.append(narrowed(values[key], node.meta.get(META_NARROW)))
    if any(META_NARROW in node.meta for node in gm.graph.nodes if node.op == "placeholder"):
        check_sizes(gm, inputs)
        check_runs(gm, inputs, whole)
    return gm, inputs


def run_wire_candidate(wire_graph: dict[str, Any], values: dict[str, Any], spec: JobSpec,
                       workdir: Path, runs: int = 1) -> Outcome:
    """Build the candidate from its wire form and `run_candidate` it."""
    started = time.monotonic()
    try:
        gm, inputs = build_candidate(wire_graph, values)
    except Exception as error:
        return Invalid(message=f"cannot build the candidate: {type(error).__name__}: {error}",
                       duration_s=time.monotonic() - started)
    outcome = run_candidate(gm, inputs, spec, workdir, runs)
    damaged = damaged_cache_files(outcome)
    if damaged:
        # Not this candidate's failure: an earlier child was killed while writing these. Remove
        # them (only inside the compile caches) and compile again, once.
        for path in damaged:
            log.warning("removing a damaged compile cache entry: %s", path)
            path.unlink(missing_ok=True)
        gm, inputs = build_candidate(wire_graph, values)
        outcome = run_candidate(gm, inputs, spec, workdir, runs)
    return outcome


def damaged_cache_files(outcome: Outcome) -> list[Path]:
    """Binaries inside the compile caches that `outcome`'s error says are damaged (truncated)."""
    if not isinstance(outcome, Fails):
        return []
    roots = [Path(root).resolve() for root in (os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
                                                  os.environ.get("TRITON_CACHE_DIR"), tempfile.gettempdir())
             if root]
    damaged = []
    for match in _DAMAGED_BINARY.finditer(outcome.signature.text):
        path = Path(match["path"]).resolve()
        if path.is_file() and any(path.is_relative_to(root) for root in roots):
            damaged.append(path)
    return damaged


def run_candidate(gm: fx.GraphModule, inputs: list[Any], spec: JobSpec, workdir: Path, runs: int = 1) -> Outcome:
    """Compile `gm` with the spec's backend and config, run it on `inputs`, classify the result.

    With `runs` > 1 (the original) the program is compiled once and run that many times, so a
    flaky runtime or accuracy failure shows as `Fails(failed_runs < runs)` without paying for
    more compiles; a failure while compiling is one run. Inside the spec's autocast region, where
    it has one, the compile and the forward runs, eager's and the fp64 reference's included (an
    fp64 tensor is never cast); gradients are taken outside it (`accuracy.gradients`).
    """
    with autocast_region(spec.autocast):
        return _run_candidate(gm, inputs, spec, workdir, runs)


def _run_candidate(gm: fx.GraphModule, inputs: list[Any], spec: JobSpec, workdir: Path, runs: int) -> Outcome:
    started = time.monotonic()
    # Builds written whole, also where no warm-up installed it first (a spawned server's first
    # children, a pool started without warm-up): this child may be killed mid-link. Precompiled
    # headers with the machine's compile cache, not in this job's temp dir.
    whole_builds.install()
    warmup.keep_precompiled_headers_with_the_caches()
    try:
        apply_inductor_config(spec.config)
        training = spec.failure.training and spec.failure.kind != "accuracy"  # accuracy: judges_gradients
        backend = resolve_backend(spec.backend, workdir, dynamic_shapes_of(gm.graph, spec.dynamic), training)
        inputs = _to_device(inputs, spec.device)
        if training:  # a compile for training (a capture of a compile that failed in AOT's joint graph)
            inputs = for_training(inputs)
    except Exception as error:
        _raise_if_environment_fault(error)
        if not isinstance(error, BackendError | RuntimeError):
            raise
        return Invalid(message=str(error), duration_s=time.monotonic() - started)
    if spec.failure.kind == "accuracy":
        return _run_for_accuracy(gm, inputs, backend, spec, started, runs)
    # A crash job's program may raise eagerly (the compiled program dies instead): one that raises
    # compiled too is judged against eager, on a copy the compile cannot have changed.
    eager_gm = copy.deepcopy(gm) if spec.failure.kind == "crash" else None
    try:
        compiled = backend(gm, _clone_inputs(inputs))
    except Exception as error:
        return _unless_eager_raises(eager_gm, inputs, failure(error, "compile_error", started))

    def run_once() -> Outcome:
        run_started = time.monotonic()
        try:
            # A program may write into its inputs: every run but a single one gets fresh copies.
            run_compiled(compiled, inputs if runs == 1 else _clone_inputs(inputs))
            _synchronize(spec.device)
        except Exception as error:
            return _unless_eager_raises(eager_gm, inputs, failure(error, "runtime_error", run_started))
        return Passes(duration_s=time.monotonic() - run_started)

    return repeated(run_once, runs, time.monotonic() - started, _stops(spec.device))


def _unless_eager_raises(eager_gm: fx.GraphModule | None, inputs: list[Any], outcome: Outcome) -> Outcome:
    """`outcome` (the compiled program raised), or `Invalid` where `eager_gm` (a crash job's
    program) raises eagerly too: an error both ways is the program's own, never the compiler bug a
    crash job minimizes (which is the compiled program dying where eager raises, or runs)."""
    if eager_gm is None or not isinstance(outcome, Fails):
        return outcome
    try:
        with torch.no_grad():
            eager_gm(*_clone_inputs(inputs))
    except Exception as error:
        _raise_if_environment_fault(error)
        return Invalid(message=f"the program raises when run eagerly, and the compiled program raises too "
                               f"({outcome.signature}), not a crash: its own error, {type(error).__name__}: "
                               f"{error}"[:2000], duration_s=outcome.duration_s)
    return outcome


def _stops(device: str) -> Callable[[Outcome], bool]:
    """After which run the original's runs end early: an outcome that is not a plain pass or
    failure (out of memory), or an exception on CUDA (the context may be unusable after one)."""
    def stops(outcome: Outcome) -> bool:
        return not isinstance(outcome, Passes | Fails) or (
            isinstance(outcome, Fails) and outcome.signature.kind != "accuracy" and device.startswith("cuda"))
    return stops


def judges_gradients(spec: JobSpec) -> bool:
    """Whether an accuracy job judges gradients: its signature is a `GradientError` (a capture of
    a training step whose gradients differed from eager's)."""
    parsed = signatures.parse_signature(spec.failure.signature) if spec.failure.signature else None
    return spec.failure.kind == "accuracy" and parsed is not None and parsed[0] == GRADIENT_EXC_TYPE


def _training(backend: Backend, spec: JobSpec) -> Backend:
    """The spec's backend compiling for training (grad mode on): inductor through `compile_fx`, as
    torch.compile calls it, without the no_grad of inference; any other backend as it is."""
    if spec.backend != "inductor":
        return backend

    def compile_for_training(gm: fx.GraphModule, inputs: list[Any]) -> Any:
        from torch._inductor.compile_fx import compile_fx

        with torch.enable_grad():
            return compile_fx(gm, inputs)

    return compile_for_training


def _raise_if_environment_fault(error: BaseException) -> None:
    """Raise EnvironmentFault where `error` says the device is unusable in this process
    (`environment_fault`): the sandbox's fault, not the candidate's."""
    fault = environment_fault(error)
    if fault is not None:
        raise EnvironmentFault(fault) from error


def _missing_error(gm: fx.GraphModule, inputs: list[Any], backend: Backend, eager_error: Exception,
                   started: float) -> Outcome:
    """Eager raised `eager_error`: a `MissingError` when the compiled graph returns a result,
    `Invalid` when it raises too (the program's own error, no compiler bug)."""
    said = f"{type(eager_error).__name__}: {eager_error}"
    try:
        compiled = backend(copy.deepcopy(gm), _clone_inputs(inputs))
        run_compiled(compiled, _clone_inputs(inputs))
    except Exception as error:
        _raise_if_environment_fault(error)
        return Invalid(message=f"the eager reference run failed, and so does the compiled program: {said}"[:2000],
                       duration_s=time.monotonic() - started)
    return failure(missing_error(eager_error), "accuracy", started)


def _run_for_accuracy(gm: fx.GraphModule, inputs: list[Any], backend: Backend, spec: JobSpec,
                      started: float, runs: int = 1) -> Outcome:
    strict = spec.failure.strict_accuracy
    training = judges_gradients(spec)
    if training:
        backend = _training(backend, spec)
    eager_inputs = _clone_inputs(inputs)
    try:
        reference = copy.deepcopy(gm)(*eager_inputs)
    except Exception as error:
        _raise_if_environment_fault(error)
        return _missing_error(gm, inputs, backend, error, started)
    fp64 = None
    try:
        fp64 = fp64_reference(gm, inputs)
    except Exception as error:
        # torch's non-strict accuracy requires the fp64 reference and skips the graph without it.
        if not strict:
            return Invalid(message=f"cannot compute the fp64 reference: {type(error).__name__}: {error}",
                           duration_s=time.monotonic() - started)
    positions = gradient_inputs(inputs, requiring_grad_only=False) if training else []
    try:
        compiled = backend(copy.deepcopy(gm), [clone_input(value.detach()).requires_grad_(True) if position in positions
                                               else value for position, value in enumerate(_clone_inputs(inputs))])
    except Exception as error:
        return failure(error, "compile_error", started)
    compile_s = time.monotonic() - started

    def run_once() -> Outcome:
        run_started = time.monotonic()
        try:
            compiled_inputs = _clone_inputs(inputs)
            result = run_compiled(compiled, compiled_inputs)
            _synchronize(spec.device)
        except Exception as error:
            return failure(error, "runtime_error", run_started)
        tolerance = spec.failure.tolerance
        floats = float_divergence(reference, result, fp64, tolerance=tolerance, strict=strict)
        integers = integer_divergence(reference, result, fp64, tolerance=tolerance, gm=gm, inputs=inputs)
        duration = time.monotonic() - run_started
        detail = described(floats, integers)
        written = None if detail is not None else written_inputs(inputs, eager_inputs, compiled_inputs,
                                                                 tolerance=tolerance)
        if written is not None:  # the outputs agree; an input the graph writes into does not
            return _wrong_values(written, WRITTEN_INPUTS_ONLY, time.monotonic() - run_started)
        merged = None if detail is not None else merged_outputs(reference, result)
        if merged is not None:  # the values agree; two outputs are one tensor, eager's two
            return _wrong_values(merged, OUTPUTS_MERGED, time.monotonic() - run_started)
        if detail is None and positions:
            return _gradients_judged(gm, inputs, compiled, positions, spec, run_started)
        if detail is None:
            return Passes(duration_s=duration)
        return _wrong_values(detail, "" if floats is not None else INTEGER_ONLY, duration)

    return repeated(run_once, runs, compile_s, _stops(spec.device))


def _wrong_values(detail: str, key: str, duration_s: float) -> Fails:
    """An accuracy job's failure: `AccuracyError: detail`, keyed `key` (the contract's keys)."""
    return Fails(signature=Signature(kind="accuracy", exc_type=ACCURACY_EXC_TYPE, key=key,
                                     text=f"{ACCURACY_EXC_TYPE}: {detail}"), duration_s=duration_s)


def _gradients_judged(gm: fx.GraphModule, inputs: list[Any], compiled: Any, positions: list[int], spec: JobSpec,
                      started: float) -> Outcome:
    """The compiled gradients of the inputs at `positions` against eager's (its outputs agreed)."""
    try:
        detail = gradient_divergence(copy.deepcopy(gm), inputs, lambda *args: run_compiled(compiled, list(args)),
                                     positions, tolerance=spec.failure.tolerance,
                                     strict=spec.failure.strict_accuracy)
    except Exception as error:
        _raise_if_environment_fault(error)
        return Invalid(message=f"cannot compute the gradients: {type(error).__name__}: {error}"[:2000],
                       duration_s=time.monotonic() - started)
    duration = time.monotonic() - started
    if detail is None:
        return Passes(duration_s=duration)
    return Fails(signature=Signature(kind="accuracy", exc_type=GRADIENT_EXC_TYPE, key="",
                                     text=f"{GRADIENT_EXC_TYPE}: {detail}"), duration_s=duration)
