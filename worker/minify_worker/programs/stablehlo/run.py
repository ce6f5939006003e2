"""Run one StableHLO candidate in a sandbox child and classify what happened, by the rules every
runner shares (`programs.classify`, oracle.py): an exception while compiling is `Fails(compile_error)`, while
running `Fails(runtime_error)`, outputs that differ from the reference `Fails(accuracy,
AccuracyError)` (`accuracy.py`), a module that does not
build or parse `Invalid`; a crash, a hang or a memory blow-up is classified by the sandbox from
how the child died.

Backends (`spec.backend`):
- `xla`: XLA through jax on the spec's device, with the spec's XLA options (`xla.` config keys).
  The accuracy reference is XLA with default options, or StableHLO's reference interpreter
  (`--config minify.reference=interpreter`), compared with `allclose`; with
  `minify.reference=f64`, XLA's default result judged against the program promoted to f64 by
  torch's rule (`accuracy.py`).
- `command`: an external command (`command.py`); its reference for accuracy is XLA's.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from minify_contract.models import JobSpec
from minify_worker import oracle
from minify_worker.outcomes import INTEGER_ONLY, Crashed, Fails, Invalid, Outcome, Passes, Signature
from minify_worker.programs.classify import failure, repeated

from . import accuracy, command, xla
from . import arrays as array_io
from .module import Module, from_wire, render

REFERENCE_KEY = "minify.reference"
REFERENCES = ("xla", "interpreter", "f64")
BACKENDS = ("xla", "command")
WIRE_MODULE = "module"


def candidate_inputs(module: Module, values: Mapping[str, Any]) -> list[np.ndarray]:
    """The candidate's arguments from the value store, in order; a value larger than its
    argument's type (the shrink phase halved a size) is sliced to its leading part."""
    missing = [value.key for value in module.args if value.key not in values]
    if missing:
        raise KeyError(f"no recorded value for {', '.join(missing)}")
    return [_fitted(array_io.to_numpy(values[value.key]), value.type) for value in module.args]


def _fitted(array: np.ndarray, type_text: str) -> np.ndarray:
    shape = array_io.shape_of(type_text)
    if shape is None or list(array.shape) == shape[0]:
        return array
    dims = shape[0]
    if len(dims) != array.ndim or any(want > have for want, have in zip(dims, array.shape, strict=True)):
        raise ValueError(f"a value of shape {list(array.shape)} cannot be an argument of type {type_text}")
    return array[tuple(slice(0, want) for want in dims)].copy(order="C")


def run_wire_candidate(wire: dict[str, Any], values: Mapping[str, Any], spec: JobSpec, workdir: Path,
                       runs: int = 1) -> Outcome:
    started = time.monotonic()
    try:
        module = from_wire(wire[WIRE_MODULE])
        text = render(module)
        inputs = candidate_inputs(module, values)
        check_parses(text)
    except Exception as error:
        return Invalid(message=f"cannot build the candidate: {type(error).__name__}: {error}"[:2000],
                       duration_s=time.monotonic() - started)
    return run_module(text, inputs, spec, Path(workdir), runs)


def check_parses(text: str) -> None:
    from jax._src.lib.mlir import ir

    from .parse import context

    ir.Module.parse(text, context=context())


def reference_outputs(text: str, inputs: Sequence[np.ndarray],
                      spec: JobSpec) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """What the module should compute (XLA with default options, or the interpreter), and with
    `minify.reference=f64` the outputs of the program promoted to f64 (`xla.to_f64`) as well."""
    reference = spec.config.get(REFERENCE_KEY, "xla")
    if reference not in REFERENCES:
        raise ValueError(f"{REFERENCE_KEY} must be one of {', '.join(REFERENCES)}, not {reference!r}")
    if reference == "interpreter":
        return xla.interpret(text, inputs), None
    same = xla.compile_module(text, {}, spec.device)(inputs)
    if reference == "f64":
        return same, xla.compile_module(xla.to_f64(text), {}, spec.device)(xla.widened(inputs))
    return same, None


def run_module(text: str, inputs: list[np.ndarray], spec: JobSpec, workdir: Path, runs: int = 1) -> Outcome:
    """Compile and run the module `text` on `inputs` with the spec's backend, `runs` times
    (compiled once), and classify the result."""
    started = time.monotonic()
    accuracy = spec.failure.kind == "accuracy"
    reference: list[np.ndarray] | None = None
    fp64: list[np.ndarray] | None = None
    if accuracy:
        try:
            reference, fp64 = reference_outputs(text, inputs, spec)
        except Exception as error:
            return Invalid(message=f"the reference run failed: {type(error).__name__}: {error}"[:2000],
                           duration_s=time.monotonic() - started)
    if spec.backend == "command":
        return _run_command(text, inputs, spec, workdir, reference, fp64, started)
    if spec.backend != "xla":
        return Invalid(message=f"backend {spec.backend!r} cannot run a StableHLO program "
                               f"(it takes {', '.join(BACKENDS)})", duration_s=0.0)
    try:
        compiled = xla.compile_module(text, xla.xla_options(spec.config), spec.device)
    except xla.OptionError as error:
        return Invalid(message=str(error)[:2000], duration_s=time.monotonic() - started)
    except Exception as error:
        return failure(error, "compile_error", started)
    compile_s = time.monotonic() - started

    def run_once() -> Outcome:
        run_started = time.monotonic()
        try:
            outputs = compiled(inputs)
        except Exception as error:
            return failure(error, "runtime_error", run_started)
        if reference is not None:
            detail = compare(reference, outputs, spec, fp64)
            if detail is not None:
                return Fails(signature=accuracy_signature(detail, reference, outputs, spec, fp64),
                             duration_s=time.monotonic() - run_started)
        return Passes(duration_s=time.monotonic() - run_started)

    return repeated(run_once, runs, compile_s)


def _run_command(text: str, inputs: list[np.ndarray], spec: JobSpec, workdir: Path,
                 reference: list[np.ndarray] | None, fp64: list[np.ndarray] | None, started: float) -> Outcome:
    try:
        completed = command.run(text, inputs, spec.config, workdir)
    except command.CommandError as error:
        return Invalid(message=str(error), duration_s=time.monotonic() - started)
    duration = time.monotonic() - started
    if completed.returncode < 0:
        number = -completed.returncode
        return Crashed(signal=number, signature=oracle.crash_signature(number), duration_s=duration)
    if completed.returncode != 0:
        signature = oracle.signature_from_text(command.EXC_TYPE, command.failure_message(completed), "compile_error")
        return Fails(signature=signature, duration_s=duration)
    if reference is not None and completed.outputs is not None:
        detail = compare(reference, completed.outputs, spec, fp64)
        if detail is not None:
            signature = accuracy_signature(detail, reference, completed.outputs, spec, fp64)
            return Fails(signature=signature, duration_s=duration)
    return Passes(duration_s=duration)


def compare(reference: Sequence[np.ndarray], outputs: Sequence[np.ndarray], spec: JobSpec,
            fp64: Sequence[np.ndarray] | None = None) -> str | None:
    """None when `outputs` pass for `reference` (`accuracy.py`: allclose, or torch's rule against
    `fp64` when there is one), else what differs."""
    tolerance, strict = spec.failure.tolerance, spec.failure.strict_accuracy
    if fp64 is None:
        return accuracy.differs(reference, outputs, tolerance, strict)
    return accuracy.differs_from_fp64(reference, outputs, fp64, tolerance, strict)


def accuracy_signature(detail: str, reference: Sequence[np.ndarray], outputs: Sequence[np.ndarray], spec: JobSpec,
                       fp64: Sequence[np.ndarray] | None) -> Signature:
    """The accuracy failure `detail` describes, keyed as the FX runner keys it (`INTEGER_ONLY` when
    the floating-point outputs of `outputs` pass and only integer or boolean ones differ), so a
    float failure does not drift into an integer one, nor back."""
    from minify_contract.accuracy import ACCURACY_EXC_TYPE

    key = ""
    if len(reference) == len(outputs) and (fp64 is None or len(fp64) == len(outputs)):
        floats = [position for position, array in enumerate(reference) if accuracy.is_floating(np.asarray(array))]
        if compare([reference[i] for i in floats], [outputs[i] for i in floats], spec,
                   None if fp64 is None else [fp64[i] for i in floats]) is None:
            key = INTEGER_ONLY
    return Signature(kind="accuracy", exc_type=ACCURACY_EXC_TYPE, key=key, text=f"{ACCURACY_EXC_TYPE}: {detail}")
