"""StableHLO programs read, prepared and run for real, in this process: jax's MLIR parser, XLA:CPU
compiles of tiny modules (milliseconds each), the command backend's real processes (issue 32)."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from minify_client.models import JobSpec
from minify_worker.loader import FORMAT, ProgramError
from minify_worker.outcomes import Crashed, Fails, Invalid, Passes
from minify_worker.programs.stablehlo import REPRESENTATION, parse, prepare, surgery, xla
from minify_worker.programs.stablehlo.command import ALLOWED_COMMANDS_ENV
from minify_worker.programs.stablehlo.module import render
from tests.support import hlo_programs

STRICT = {"kind": "accuracy", "strict_accuracy": True}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, Path]:
    folder = tmp_path_factory.mktemp("nan_max")
    text, arrays = hlo_programs.nan_max_program()
    program, inputs = hlo_programs.write_program(folder, text, arrays)
    prepare.prepare(program, inputs, folder / "work")
    document = json.loads((folder / "work" / "program.json").read_text())
    values = torch.load(folder / "work" / "values.pt", weights_only=True)
    return document, values, folder


def _outputs(text: str, arrays: list[np.ndarray]) -> list[np.ndarray]:
    return xla.compile_module(text, {})(arrays)


def test_a_module_read_and_rendered_again_computes_the_same() -> None:
    text = hlo_programs.control_flow_program()
    module = parse.read(text.encode())
    assert {"stablehlo.case", "stablehlo.while", "stablehlo.reduce"} <= {op.kind for op in module.ops}
    arrays = [np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32), np.array(1, np.int32)]
    for got, want in zip(_outputs(render(module), arrays), _outputs(text, arrays), strict=True):
        np.testing.assert_array_equal(got, want)


def test_hlo_text_bytecode_and_vhlo_are_read_as_stablehlo() -> None:
    from jax._src.lib.mlir import ir
    from jaxlib.mlir._mlir_libs import _stablehlo

    hlo = hlo_programs.hlo_text_program()
    assert parse.program_format(hlo.encode()) == "hlo"
    module = parse.read(hlo.encode())
    assert [op.kind for op in module.ops][-1] == "stablehlo.reduce"
    parsed = ir.Module.parse(render(module), context=parse.context())
    bytecode = io.BytesIO()
    parsed.operation.write_bytecode(bytecode)
    vhlo = _stablehlo.serialize_portable_artifact(parsed, _stablehlo.get_current_version())
    for data in (bytecode.getvalue(), vhlo):
        assert parse.program_format(data) == "bytecode"
        assert render(parse.read(data)) == render(parse.read(render(module).encode()))


def test_prepare_writes_what_the_fx_loader_writes_with_real_intermediate_values(prepared) -> None:
    document, values, folder = prepared
    assert document["format"] == FORMAT and document["metadata"]["nodes_original"] == 24
    assert document["metadata"]["intermediates"] == "xla"
    module = REPRESENTATION.from_wire(document["graph"])
    reduce_op = next(op for op in module.ops if op.kind == "stablehlo.reduce")
    row_max = values[reduce_op.result_keys[0]]
    assert torch.isnan(row_max[1]) and not torch.isnan(row_max[0])
    np.testing.assert_array_equal(values["a0"].numpy(), np.load(folder / "inputs.npz")["arr_0"])


def test_prepare_refuses_what_is_not_a_program_and_inputs_that_do_not_fit(tmp_path: Path) -> None:
    junk = tmp_path / "junk.mlir"
    junk.write_text("def f(x): return x\n")
    with pytest.raises(ProgramError, match="not a StableHLO module MLIR can parse"):
        prepare.prepare(junk, None, tmp_path / "work")
    text, arrays = hlo_programs.nan_max_program()
    program, inputs = hlo_programs.write_program(tmp_path, text, [arrays[0].T.copy(), arrays[1]])
    with pytest.raises(ProgramError, match=r"argument 0 must be tensor<4x8xf32>.*float32\[8, 4\]"):
        prepare.prepare(program, inputs, tmp_path / "work")


def test_fast_min_max_fails_strict_accuracy_against_xla_defaults_and_the_interpreter(prepared) -> None:
    document, values, folder = prepared
    for reference in ("xla", "interpreter"):
        spec = JobSpec(backend="xla", config={**hlo_programs.FAST_MIN_MAX, "minify.reference": reference},
                       failure=STRICT)
        outcome = REPRESENTATION.run_wire_candidate(document["graph"], values, spec, folder, runs=2)
        assert isinstance(outcome, Fails) and outcome.signature.exc_type == "AccuracyError"
        assert outcome.failed_runs == 2
    default = JobSpec(backend="xla", failure=STRICT)
    assert isinstance(REPRESENTATION.run_wire_candidate(document["graph"], values, default, folder), Passes)


def test_the_reduce_alone_on_its_recorded_input_still_fails(prepared) -> None:
    document, values, folder = prepared
    module = REPRESENTATION.from_wire(document["graph"])
    alone = surgery.keep_ops(module, [op for op in module.ops if op.kind == "stablehlo.reduce"][:1])
    assert alone is not None and len(alone.ops) == 1
    spec = JobSpec(backend="xla", config=hlo_programs.FAST_MIN_MAX, failure=STRICT)
    assert isinstance(REPRESENTATION.run_wire_candidate(REPRESENTATION.to_wire(alone), values, spec, folder), Fails)


def test_an_unknown_xla_option_is_the_jobs_problem_not_a_failure(prepared) -> None:
    document, values, folder = prepared
    spec = JobSpec(backend="xla", config={"xla.xla_no_such_flag": True})
    outcome = REPRESENTATION.run_wire_candidate(document["graph"], values, spec, folder)
    assert isinstance(outcome, Invalid) and "No such compile option" in outcome.message


def test_a_custom_call_without_a_handler_is_a_compile_error(tmp_path: Path) -> None:
    text = ("func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
            "  %0 = stablehlo.custom_call @minify_no_such_target(%x) : (tensor<4xf32>) -> tensor<4xf32>\n"
            "  return %0 : tensor<4xf32>\n}\n")
    program, _ = hlo_programs.write_program(tmp_path, text)
    prepare.prepare(program, None, tmp_path / "work")
    document = json.loads((tmp_path / "work" / "program.json").read_text())
    assert document["metadata"]["intermediates"] == "generated"
    values = torch.load(tmp_path / "work" / "values.pt", weights_only=True)
    outcome = REPRESENTATION.run_wire_candidate(document["graph"], values, JobSpec(backend="xla"), tmp_path)
    assert isinstance(outcome, Fails) and outcome.signature.kind == "compile_error"
    assert outcome.signature.exc_type == "JaxRuntimeError" and "minify_no_such_target" in outcome.signature.text


def _command_spec(script: str) -> JobSpec:
    return JobSpec(backend="command", config={"command.argv": [sys.executable, "-c", script, "{module}", "{inputs}"]})


def test_a_command_fails_with_what_it_says_and_crashes_with_its_signal(prepared, monkeypatch) -> None:
    document, values, folder = prepared
    monkeypatch.setenv(ALLOWED_COMMANDS_ENV, str(Path(sys.executable).resolve().parent))
    says = ("import sys, numpy; text = open(sys.argv[1]).read(); n = len(numpy.load(sys.argv[2]).files); "
            "sys.exit('error: reduce unsupported' if 'stablehlo.reduce' in text and n == 2 else 0)")
    outcome = REPRESENTATION.run_wire_candidate(document["graph"], values, _command_spec(says), folder)
    assert isinstance(outcome, Fails) and outcome.signature.exc_type == "CommandFailed"
    assert str(outcome.signature) == "CommandFailed: reduce unsupported"
    crash = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    outcome = REPRESENTATION.run_wire_candidate(document["graph"], values, _command_spec(crash), folder)
    assert isinstance(outcome, Crashed) and outcome.signature.exc_type == "SIGSEGV"
    assert isinstance(REPRESENTATION.run_wire_candidate(document["graph"], values, _command_spec("pass"), folder),
                      Passes)


def test_a_command_the_operator_did_not_allow_never_runs(prepared, monkeypatch, tmp_path: Path) -> None:
    document, values, folder = prepared
    monkeypatch.setenv(ALLOWED_COMMANDS_ENV, "/nowhere/")
    marker = tmp_path / "ran"
    outcome = REPRESENTATION.run_wire_candidate(
        document["graph"], values, _command_spec(f"open({str(marker)!r}, 'w')"), folder)
    assert isinstance(outcome, Invalid) and ALLOWED_COMMANDS_ENV in outcome.message
    assert not marker.exists() and os.environ[ALLOWED_COMMANDS_ENV] == "/nowhere/"
