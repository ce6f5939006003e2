"""The artifacts of a StableHLO job (`artifacts_target`, a `SandboxPool.call` target): the
minimal module as `minimized.mlir` (and `minimized.hlo`, XLA's HLO text of it), its arguments as
`inputs.npz`, and `repro.py`, which needs only jax and numpy.

repro.py follows the FX repro's conventions (programs/fx/repro.py): a header that says what fails
and where, the job's settings as constants, minify's signature rules verbatim; `python repro.py`
exits non-zero with the failure's traceback and a `repro failed with: <signature>` line while the
bug is there (a crash: the process dies by that signal), and prints `repro passed` and exits 0
once it is fixed. An accuracy check is the worker's (`accuracy.py`, verbatim in the repro).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from minify_contract import signatures
from minify_contract.models import JobSpec
from minify_worker.engine.artifacts import (
    STORAGE_ERRNOS,
    WATCH_FOR_THE_HANG,
    ArtifactWriteError,
    hang_notes,
    header_tail,
)
from minify_worker.outcomes import Signature, signature_from_dict

from . import accuracy, xla
from . import arrays as array_io
from .command import ARGV_KEY
from .module import Module, from_wire, render
from .parse import pretty
from .run import REFERENCE_KEY, WIRE_MODULE, candidate_inputs

MINIMIZED = "minimized.mlir"
MINIMIZED_HLO = "minimized.hlo"
INPUTS = "inputs.npz"
REPRO = "repro.py"


def write_program_artifacts(context: Any, *, wire_graph: dict[str, Any], out_dir: str, spec_json: str,
                            signature: dict[str, Any] | None = None, environment: Mapping[str, str] | None = None,
                            culprit_lines: list[str] | None = None,
                            hang_bound_s: float | None = None) -> dict[str, Any]:
    """Write minimized.mlir, minimized.hlo, inputs.npz and repro.py into `out_dir` (absolute).
    Returns `{"files": [names written], "errors": {name: message}}`, as the FX writer does
    (`hang_bound_s` as there: a hang's repro.py holds its run to it)."""
    names = (MINIMIZED, MINIMIZED_HLO, INPUTS, REPRO)
    if not Path(out_dir).is_absolute():
        reason = f"out_dir {out_dir!r} is relative; the sandbox child needs an absolute folder"
        return {"files": [], "errors": {name: reason for name in names}}
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    module = from_wire(wire_graph[WIRE_MODULE])
    spec = JobSpec.model_validate_json(spec_json)
    target = signature_from_dict(signature) if signature is not None else None
    import jax

    writers = {
        MINIMIZED: lambda path: path.write_text(pretty(render(module))),
        MINIMIZED_HLO: lambda path: path.write_text(hlo_text(render(module))),
        INPUTS: lambda path: write_inputs(path, module, context.values),
        REPRO: lambda path: path.write_text(render_repro(module, spec, target, jax.__version__, environment or {},
                                                         culprit_lines or [], hang_bound_s)),
    }
    files, errors = [], {}
    for name, write in writers.items():
        try:
            write(folder / name)
            files.append(name)
        except OSError as error:
            if error.errno not in STORAGE_ERRNOS:
                errors[name] = f"{type(error).__name__}: {error}"[:2000]
                continue
            # The storage refused it (a full disk): the FX writer's answer, which the engine raises again.
            (folder / name).unlink(missing_ok=True)
            return {"files": files, "errors": {name: str(ArtifactWriteError(name, error))},
                    "storage_error": [name, [error.errno, error.strerror]]}
        except Exception as error:
            errors[name] = f"{type(error).__name__}: {error}"[:2000]
    return {"files": files, "errors": errors}


def hlo_text(text: str) -> str:
    """XLA's HLO text of a StableHLO module (what `run_hlo_module` and XLA's dumps read)."""
    from jax._src.lib import _jax

    return _jax.mlir.mlir_module_to_xla_computation(text, use_tuple_args=False, return_tuple=False).as_hlo_text()


def write_inputs(path: Path, module: Module, values: Mapping[str, Any]) -> None:
    """The minimal module's arguments as `arg0, arg1, ...`; bfloat16 and float8 as their bits
    (numpy's own format has no such dtypes), which repro.py views back by the argument's type."""
    arrays = {}
    for position, array in enumerate(candidate_inputs(module, values)):
        if array.dtype.name.startswith(("bfloat", "float8")):
            array = array.view(np.dtype(f"u{array.dtype.itemsize}"))
        arrays[f"arg{position}"] = array
    with path.open("wb") as file:
        np.savez(file, **arrays)


def render_repro(module: Module, spec: JobSpec, signature: Signature | None, jax_version: str,
                 environment: Mapping[str, str], culprit_lines: list[str], hang_bound_s: float | None = None) -> str:
    """A standalone script (jax and numpy) that compiles and runs minimized.mlir as the worker does; a
    hang's (`hang_bound_s`) holds compiling and running to that bound (`WATCH_FOR_THE_HANG`)."""
    kind = signature.kind if signature is not None else spec.failure.kind
    bound_s = hang_bound_s if kind == "timeout" else None
    dtypes = [(array_io.shape_of(value.type) or ([], np.dtype("float32")))[1].name for value in module.args]
    constants = "\n".join([
        f"BACKEND = {spec.backend!r}",
        f"DEVICE = {spec.device!r}",
        f"FAILURE_KIND = {kind!r}",
        f"TOLERANCE = {spec.failure.tolerance!r}",
        f"STRICT_ACCURACY = {spec.failure.strict_accuracy!r}",
        f"EXPECTED_SIGNATURE = {str(signature) if signature is not None else '(not recorded)'!r}",
        f"XLA_OPTIONS = {dict(sorted(xla.xla_options(spec.config).items()))!r}",
        f"REFERENCE = {spec.config.get(REFERENCE_KEY, 'xla')!r}",
        f"COMMAND = {spec.config.get(ARGV_KEY)!r}",
        f"ARGUMENT_DTYPES = {dtypes!r}",
        f"HANG_BOUND_S = {bound_s!r}",
    ])
    parts = [_header(spec, kind, signature, jax_version, environment, culprit_lines, bound_s), _IMPORTS, constants,
             _signature_rules(), _accuracy_rules(), *([WATCH_FOR_THE_HANG] if bound_s else []), _RUN_FUNCTIONS]
    return "\n\n\n".join(part.strip("\n") for part in parts) + "\n"


_EXPECTATIONS = {
    "compile_error": "XLA raises while compiling",
    "runtime_error": "XLA raises while running",
    "accuracy": "the outputs differ from the reference",
    "crash": "the process dies by a signal",
    "timeout": "it runs past the job's time limit",
    "oom": "it runs out of memory",
    "any": "any failure",
}


def _header(spec: JobSpec, kind: str, signature: Signature | None, jax_version: str,
            environment: Mapping[str, str], culprit_lines: list[str], bound_s: float | None = None) -> str:
    options = xla.xla_options(spec.config)
    lines = [
        "Minimized repro written by minify (jax and numpy only; no minify import).",
        "",
        f"Expected failure: {kind} ({_EXPECTATIONS.get(kind, kind)})",
        f"Signature:        {signature if signature is not None else '(not recorded)'}",
        f"Backend:          {spec.backend}" + (" (XLA through jax)" if spec.backend == "xla" else ""),
        f"Device:           {spec.device}",
        f"Minimized with:   jax {jax_version}",
        f"XLA options:      {json.dumps(options, sort_keys=True) if options else '(none)'}",
    ]
    if kind == "accuracy":
        reference = spec.config.get(REFERENCE_KEY, "xla")
        against = {"interpreter": "StableHLO's interpreter",
                   "f64": "XLA with default options, judged against the program in f64"}.get(
                       reference, "XLA with default options")
        lines.append(f"Accuracy:         against {against}, tolerance {spec.failure.tolerance} for floating-point "
                     "outputs; integers and booleans exactly")
    if spec.backend == "command":
        lines.append(f"Command:          {spec.config.get(ARGV_KEY)} ({{module}}: minimized.mlir, {{inputs}}: an .npz)")
    lines += hang_notes(bound_s)
    lines += header_tail(culprit_lines, environment, "on the worker",
                         "Run: python repro.py [--module minimized.mlir] [--inputs inputs.npz]   (beside this file by "
                         "default)")
    return "\n".join(f"# {line}".rstrip() for line in "\n".join(lines).splitlines())


def _signature_rules() -> str:
    """minify_contract/signatures.py, verbatim: how the repro names its failure, as minify does."""
    source = inspect.getsource(signatures).replace("from __future__ import annotations\n", "")
    return "# " + "-" * 20 + " minify's signature rules (minify_contract/signatures.py, verbatim) " + "-" * 7 + \
        "\n" + source.strip("\n") + "\n\n# " + "-" * 93


def _accuracy_rules() -> str:
    """accuracy.py and the f64 program's writer (xla.to_f64, xla.widened), verbatim: the repro
    judges outputs as the worker did."""
    source = inspect.getsource(accuracy).replace("from __future__ import annotations\n", "")
    source = source.replace("from collections.abc import Sequence\n", "").replace("import numpy as np\n", "")
    f64 = "\n".join([f"NARROW_FLOATS = {xla.NARROW_FLOATS!r}",
                     f"HEX_CONSTANT = re.compile({xla.HEX_CONSTANT.pattern!r})",
                     f"NARROW_TYPE = re.compile({xla.NARROW_TYPE.pattern!r})",
                     inspect.getsource(xla.to_f64), inspect.getsource(xla.widened)])
    return ("# " + "-" * 12 + " minify's accuracy rules (programs/stablehlo/accuracy.py and xla.to_f64, verbatim) "
            + "\n" + source.strip("\n") + "\n\n\n" + f64.strip("\n") + "\n\n# " + "-" * 93)


_IMPORTS = """
import argparse
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.extend
import ml_dtypes
import numpy as np
from jax._src import compiler
from jax._src.lib import xla_client
"""

_RUN_FUNCTIONS = '''
class AccuracyError(Exception):
    pass


class CommandFailed(Exception):
    pass


def load_inputs(path):
    with np.load(path, allow_pickle=False) as archive:
        arrays = [archive[f"arg{position}"] for position in range(len(archive.files))]
    return [array.view(getattr(ml_dtypes, name)) if hasattr(ml_dtypes, name) and array.dtype.name != name
            else array for array, name in zip(arrays, ARGUMENT_DTYPES)]


def compile_module(text, options):
    """XLA through jax (0.10): compile the module's text with per-compile XLA options."""
    jax.config.update("jax_enable_x64", True)  # f64 and i64 arguments stay 64-bit on their way in
    backend = jax.extend.backend.get_backend("cuda" if DEVICE.startswith("cuda") else "cpu")
    device = backend.devices()[int(DEVICE.partition(":")[2] or 0)]
    executable = backend.compile_and_load(text, xla_client.DeviceList((device,)),
                                          compiler.get_compile_options(1, 1, env_options_overrides=dict(options)))

    def run(arrays):
        return [np.asarray(output) for output in executable.execute([jax.device_put(a, device) for a in arrays])]

    return run


def interpret(text, arrays):
    """StableHLO's reference interpreter."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir
    from jaxlib.mlir._mlir_libs import _stablehlo

    with mlir.make_ir_context():
        module = ir.Module.parse(text)
        attributes = [ir.DenseElementsAttr.get(np.asarray(array).copy(order="C")) for array in arrays]
        return [np.array(result) for result in _stablehlo.eval_module(module, attributes)]


def run_command(module_path, arrays):
    """The job's command on the module: exit status 0 passes; its outputs, if it wrote {output}.
    Its inputs and output files live in a temporary folder, removed before this returns or dies."""
    outputs = None
    with tempfile.TemporaryDirectory(prefix="repro-") as scratch:
        folder = Path(scratch)
        paths = {"module": module_path, "inputs": folder / "inputs.npz", "output": folder / "output.npz"}
        np.savez(paths["inputs"], **{f"arg{position}": array for position, array in enumerate(arrays)})
        argv = COMMAND.split() if isinstance(COMMAND, str) else list(COMMAND)
        for name, path in paths.items():
            argv = [part.replace("{" + name + "}", str(path)) for part in argv]
        completed = subprocess.run(argv, capture_output=True, text=True, errors="replace", stdin=subprocess.DEVNULL)
        if completed.returncode == 0 and paths["output"].is_file():
            with np.load(paths["output"], allow_pickle=False) as archive:
                outputs = [archive[name] for name in archive.files]
    if completed.returncode < 0:
        import os
        os.kill(os.getpid(), -completed.returncode)  # die the way the command did
    if completed.returncode != 0:
        said = completed.stderr.strip() or completed.stdout.strip() or "no output"
        raise CommandFailed(f"{said}\\n(exit status {completed.returncode})")
    return outputs


def check_accuracy(reference, result, fp64=None):
    """The worker's rule (minify_worker/programs/stablehlo/accuracy.py, verbatim above)."""
    if fp64 is None:
        mismatch = differs(reference, result, TOLERANCE, STRICT_ACCURACY)
    else:
        mismatch = differs_from_fp64(reference, result, fp64, TOLERANCE, STRICT_ACCURACY)
    if mismatch is not None:
        raise AccuracyError(mismatch)


def main():
    here = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(description="Run the minimized repro.")
    parser.add_argument("--module", type=Path, default=here / "minimized.mlir")
    parser.add_argument("--inputs", type=Path, default=here / "inputs.npz")
    arguments = parser.parse_args()
    text = arguments.module.read_text()
    inputs = load_inputs(arguments.inputs)
    started = watch_for_the_hang() if HANG_BOUND_S else None
    if BACKEND == "command":
        result = run_command(arguments.module, inputs)
    else:
        result = compile_module(text, XLA_OPTIONS)(inputs)
    if FAILURE_KIND == "accuracy" and result is not None:
        reference = interpret(text, inputs) if REFERENCE == "interpreter" else compile_module(text, {})(inputs)
        fp64 = compile_module(to_f64(text), {})(widened(inputs)) if REFERENCE == "f64" else None
        check_accuracy(reference, result, fp64)
    if started is not None:
        hang_over(started)
    print(f"repro passed: no failure ({BACKEND} on {DEVICE}, jax {jax.__version__})")


def explain_failure(exc_type, error, traceback):
    """After the usual traceback, the signature in the form minify recorded it (same rules, above)."""
    sys.__excepthook__(exc_type, error, traceback)
    print(file=sys.stderr)
    observed = exc_type.__name__ if isinstance(error, AccuracyError) else signature_line(error)
    print(f"repro failed with: {observed}", file=sys.stderr)
    print(f"minify expected:   {EXPECTED_SIGNATURE}", file=sys.stderr)


if __name__ == "__main__":
    sys.excepthook = explain_failure
    main()
'''
