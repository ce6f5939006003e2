"""StableHLO programs read, prepared and run for real (issue 32): jax's MLIR parser here (it starts
no thread); XLA:CPU compiles of tiny modules and the command backend's processes in the children of
one sandbox pool (tests/support/hlo_calls.py), as a job's candidates run."""

from __future__ import annotations

import errno
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from minify_contract.models import JobSpec
from minify_worker.outcomes import Crashed, Fails, Invalid, Outcome, Passes, outcome_from_dict
from minify_worker.programs.stablehlo import REPRESENTATION, parse, shrink, surgery
from minify_worker.programs.stablehlo.command import ALLOWED_COMMANDS_ENV
from minify_worker.programs.stablehlo.module import from_wire, render
from minify_worker.sandbox import SandboxCallError, SandboxPool
from tests.support import hlo_calls, hlo_programs

STRICT = {"kind": "accuracy", "strict_accuracy": True}

# Its module-scoped fixtures (a sandbox pool, a job) run once: every test of the module on one xdist worker.
pytestmark = pytest.mark.xdist_group("test_stablehlo_programs")


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Any:
    workdir = tmp_path_factory.mktemp("hlo_pool")
    spec = JobSpec(backend="xla", program_format="stablehlo")
    with SandboxPool(workdir, None, spec, parallelism=1, env=hlo_calls.ALLOWED, start="spawn") as sandbox:
        yield sandbox


@pytest.fixture(scope="module")
def prepared(pool: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    folder = tmp_path_factory.mktemp("nan_max")
    text, arrays = hlo_programs.nan_max_program()
    program, inputs = hlo_programs.write_program(folder, text, arrays)
    pool.call(f"{hlo_calls.PREFIX}:prepare_program",
              {"program": str(program), "inputs": str(inputs), "workdir": str(folder / "work")})
    return json.loads((folder / "work" / "program.json").read_text()), folder


def _run(pool: Any, wire: dict, folder: Path, spec: JobSpec, runs: int = 1,
         environment: dict[str, str] | None = None) -> Outcome:
    answer = pool.call(f"{hlo_calls.PREFIX}:run_candidate",
                       {"wire": wire, "values": str(folder / "work" / "values.pt"), "spec_json": spec.model_dump_json(),
                        "runs": runs, "environment": environment or {}})
    return outcome_from_dict(answer["outcome"])


def test_a_module_read_and_rendered_again_computes_the_same(pool: Any, tmp_path: Path) -> None:
    text = hlo_programs.control_flow_program()
    module = parse.read(text.encode())
    assert {"stablehlo.case", "stablehlo.while", "stablehlo.reduce"} <= {op.kind for op in module.ops}
    program, inputs = hlo_programs.write_program(
        tmp_path, text, [np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32), np.array(1, np.int32)])
    answer = pool.call(f"{hlo_calls.PREFIX}:same_outputs", {"original": str(program), "inputs": str(inputs)})
    assert answer == {"same": True, "outputs": 2}


def test_hlo_text_bytecode_and_vhlo_are_read_as_stablehlo(pool: Any, tmp_path: Path) -> None:
    from jax._src.lib.mlir import ir
    from jaxlib.mlir._mlir_libs import _stablehlo

    hlo, _ = hlo_programs.write_program(tmp_path, hlo_programs.hlo_text_program(), name="sin_max.hlo")
    assert parse.program_format(hlo.read_bytes()) == "hlo"
    module = from_wire(pool.call(f"{hlo_calls.PREFIX}:read_program", {"path": str(hlo)}))
    assert [op.kind for op in module.ops][-1] == "stablehlo.reduce"
    parsed = ir.Module.parse(render(module), context=parse.context())
    bytecode = io.BytesIO()
    parsed.operation.write_bytecode(bytecode)
    vhlo = _stablehlo.serialize_portable_artifact(parsed, _stablehlo.get_current_version())
    for data in (bytecode.getvalue(), vhlo):
        assert parse.program_format(data) == "bytecode"
        assert render(parse.read(data)) == render(parse.read(render(module).encode()))


def test_prepare_writes_what_the_fx_loader_writes_with_real_intermediate_values(prepared) -> None:
    import torch

    document, folder = prepared
    assert document["format"] == "minify-program/1" and document["metadata"]["nodes_original"] == 24
    assert document["metadata"]["intermediates"] == "xla"
    values = torch.load(folder / "work" / "values.pt", weights_only=True)
    module = REPRESENTATION.from_wire(document["graph"])
    reduce_op = next(op for op in module.ops if op.kind == "stablehlo.reduce")
    row_max = values[reduce_op.result_keys[0]]
    assert torch.isnan(row_max[1]) and not torch.isnan(row_max[0])
    assert values[reduce_op.operands[1]].shape == ()  # the init value: a scalar stays one
    np.testing.assert_array_equal(values["a0"].numpy(), np.load(folder / "inputs.npz")["arr_0"])


def test_prepare_refuses_what_is_not_a_program_and_inputs_that_do_not_fit(pool: Any, tmp_path: Path) -> None:
    junk, _ = hlo_programs.write_program(tmp_path, "def f(x): return x\n", name="junk.mlir")
    with pytest.raises(SandboxCallError, match=r"ProgramError: junk\.mlir: not a StableHLO module MLIR can parse"):
        pool.call(f"{hlo_calls.PREFIX}:prepare_program", {"program": str(junk), "inputs": None,
                                                          "workdir": str(tmp_path / "work")})
    text, arrays = hlo_programs.nan_max_program()
    program, inputs = hlo_programs.write_program(tmp_path, text, [arrays[0].T.copy(), arrays[1]])
    with pytest.raises(SandboxCallError, match=r"argument 0 must be tensor<4x8xf32>.*float32\[8, 4\]"):
        pool.call(f"{hlo_calls.PREFIX}:prepare_program", {"program": str(program), "inputs": str(inputs),
                                                          "workdir": str(tmp_path / "work")})


def test_fast_min_max_fails_strict_accuracy_against_xla_defaults_and_the_interpreter(pool: Any, prepared) -> None:
    document, folder = prepared
    for reference in ("xla", "interpreter"):
        spec = JobSpec(backend="xla", config={**hlo_programs.FAST_MIN_MAX, "minify.reference": reference},
                       failure=STRICT)
        outcome = _run(pool, document["graph"], folder, spec, runs=2)
        assert isinstance(outcome, Fails) and outcome.signature.exc_type == "AccuracyError"
        assert outcome.failed_runs == 2
    assert isinstance(_run(pool, document["graph"], folder, JobSpec(backend="xla", failure=STRICT)), Passes)
    # Against the program in f64 it passes, by torch's rule: a reference that has a NaN where the
    # fp64 one has too cannot judge (torch's `same`: "Found nan in reference"); its f64 program runs.
    f64 = JobSpec(backend="xla", config={**hlo_programs.FAST_MIN_MAX, "minify.reference": "f64"}, failure=STRICT)
    assert isinstance(_run(pool, document["graph"], folder, f64), Passes)


def test_the_reduce_alone_on_its_recorded_input_still_fails(pool: Any, prepared) -> None:
    document, folder = prepared
    module = REPRESENTATION.from_wire(document["graph"])
    alone = surgery.keep_ops(module, [op for op in module.ops if op.kind == "stablehlo.reduce"][:1])
    assert alone is not None and len(alone.ops) == 1
    spec = JobSpec(backend="xla", config=hlo_programs.FAST_MIN_MAX, failure=STRICT)
    assert isinstance(_run(pool, REPRESENTATION.to_wire(alone), folder, spec), Fails)


def test_a_shrunk_candidate_gets_the_leading_part_of_its_recorded_values(pool: Any, prepared) -> None:
    document, folder = prepared
    module = REPRESENTATION.from_wire(document["graph"])
    alone = surgery.keep_ops(module, [op for op in module.ops if op.kind == "stablehlo.reduce"][:1])
    spec = JobSpec(backend="xla", config=hlo_programs.FAST_MIN_MAX, failure=STRICT)
    keeps_the_nan = shrink.resize(alone, 8, 4)  # the NaN is at [1, 2]
    assert keeps_the_nan.args[0].type == "tensor<4x4xf32>"
    assert isinstance(_run(pool, REPRESENTATION.to_wire(keeps_the_nan), folder, spec), Fails)
    assert isinstance(_run(pool, REPRESENTATION.to_wire(shrink.resize(keeps_the_nan, 4, 2)), folder, spec), Passes)


def test_an_unknown_xla_option_is_the_jobs_problem_not_a_failure(pool: Any, prepared) -> None:
    document, folder = prepared
    outcome = _run(pool, document["graph"], folder, JobSpec(backend="xla", config={"xla.xla_no_such_flag": True}))
    assert isinstance(outcome, Invalid) and "No such compile option" in outcome.message


def test_a_custom_call_without_a_handler_is_a_compile_error(pool: Any, tmp_path: Path) -> None:
    text = ("func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
            "  %0 = stablehlo.custom_call @minify_no_such_target(%x) : (tensor<4xf32>) -> tensor<4xf32>\n"
            "  return %0 : tensor<4xf32>\n}\n")
    program, _ = hlo_programs.write_program(tmp_path, text)
    metadata = pool.call(f"{hlo_calls.PREFIX}:prepare_program",
                         {"program": str(program), "inputs": None, "workdir": str(tmp_path / "work")})
    assert metadata["intermediates"] == "generated"
    document = json.loads((tmp_path / "work" / "program.json").read_text())
    outcome = _run(pool, document["graph"], tmp_path, JobSpec(backend="xla"))
    assert isinstance(outcome, Fails) and outcome.signature.kind == "compile_error"
    assert outcome.signature.exc_type == "JaxRuntimeError" and "minify_no_such_target" in outcome.signature.text


def _command_spec(script: str) -> JobSpec:
    return JobSpec(backend="command", config={"command.argv": [sys.executable, "-c", script, "{module}", "{inputs}"]})


def test_a_command_fails_with_what_it_says_and_crashes_with_its_signal(pool: Any, prepared) -> None:
    document, folder = prepared
    allowed = {ALLOWED_COMMANDS_ENV: str(Path(sys.executable).resolve().parent)}
    says = ("import sys, numpy; text = open(sys.argv[1]).read(); n = len(numpy.load(sys.argv[2]).files); "
            "sys.exit('error: reduce unsupported' if 'stablehlo.reduce' in text and n == 2 else 0)")
    outcome = _run(pool, document["graph"], folder, _command_spec(says), environment=allowed)
    assert isinstance(outcome, Fails) and str(outcome.signature) == "CommandFailed: reduce unsupported"
    crash = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    outcome = _run(pool, document["graph"], folder, _command_spec(crash), environment=allowed)
    assert isinstance(outcome, Crashed) and outcome.signature.exc_type == "SIGSEGV"
    assert isinstance(_run(pool, document["graph"], folder, _command_spec("pass"), environment=allowed), Passes)


def test_a_command_the_operator_did_not_allow_never_runs(pool: Any, prepared, tmp_path: Path) -> None:
    document, folder = prepared
    marker = tmp_path / "ran"
    outcome = _run(pool, document["graph"], folder, _command_spec(f"open({str(marker)!r}, 'w')"),
                   environment={ALLOWED_COMMANDS_ENV: "/nowhere/"})
    assert isinstance(outcome, Invalid) and ALLOWED_COMMANDS_ENV in outcome.message
    assert not marker.exists()


def test_artifacts_a_full_disk_refuses_are_a_storage_error_as_for_fx_jobs(pool: Any, prepared, tmp_path: Path) -> None:
    document, folder = prepared
    arguments = {"values": str(folder / "work" / "values.pt"), "wire_graph": document["graph"],
                 "spec_json": JobSpec(backend="xla").model_dump_json()}
    written = pool.call(f"{hlo_calls.PREFIX}:write_artifacts", {**arguments, "out_dir": str(tmp_path / "all")})
    assert written == {"files": ["minimized.mlir", "minimized.hlo", "inputs.npz", "repro.py"], "errors": {}}
    full = pool.call(f"{hlo_calls.PREFIX}:write_artifacts",
                     {**arguments, "out_dir": str(tmp_path / "full"), "file_size_limit": 1000})
    assert full["storage_error"][0] == "minimized.mlir" and full["storage_error"][1][0] == errno.EFBIG
    assert not (tmp_path / "full" / "minimized.mlir").exists()


def test_a_repro_judging_against_the_program_in_f64_runs_with_jax_alone(pool: Any, prepared, tmp_path: Path) -> None:
    document, folder = prepared
    spec = JobSpec(backend="xla", config={"minify.reference": "f64"}, failure={"kind": "accuracy"})
    pool.call(f"{hlo_calls.PREFIX}:write_artifacts",
              {"values": str(folder / "work" / "values.pt"), "wire_graph": document["graph"],
               "spec_json": spec.model_dump_json(), "out_dir": str(tmp_path)})
    without_torch = ("import runpy, sys; sys.modules['torch'] = None; "
                     f"runpy.run_path({str(tmp_path / 'repro.py')!r}, run_name='__main__')")
    ran = subprocess.run([sys.executable, "-c", without_torch], capture_output=True, text=True, timeout=120,
                         check=False)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "repro passed" in ran.stdout  # XLA's default result is what the f64 program's rule accepts


def test_a_hangs_repro_holds_its_run_to_the_bound_and_passes_within_it(pool: Any, prepared, tmp_path: Path) -> None:
    """A hang's repro.py (failure kind timeout, the job's bound given) watches compiling and running
    against the bound, as the FX repro does (tests/worker/engine/test_hang_bound.py): this program
    runs at once, so it passes and says how long it took."""
    document, folder = prepared
    spec = JobSpec(backend="xla", failure={"kind": "timeout"})
    pool.call(f"{hlo_calls.PREFIX}:write_artifacts",
              {"values": str(folder / "work" / "values.pt"), "wire_graph": document["graph"],
               "spec_json": spec.model_dump_json(), "out_dir": str(tmp_path), "hang_bound_s": 60.0})
    assert "# Hang bound:       60 s" in (tmp_path / "repro.py").read_text()
    ran = subprocess.run([sys.executable, str(tmp_path / "repro.py")], capture_output=True, text=True, timeout=120,
                         check=False)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "within the 60 s bound" in ran.stdout and "repro passed" in ran.stdout
