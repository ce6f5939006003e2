"""program.json through the worker: programs torch.export.save cannot write, minimized all the same.

The programs are exported in memory and written as the capture writes them
(`minify_client.capture.program_file.as_program_json`): a `while_loop` that carries a Python int
(pytorch#166525: "SerializeError: Unsupported list/tuple argument type"; flex_attention, refused
for its block-mask tuple, comes through a capture: tests/client/capture/test_capture_wire.py). The
loader reads them from allowlists only and refuses a malformed one before anything runs; the engine
minimizes them on the compile-error and the runtime-error paths with the test backends
(tests/support/backends.py), and delivers minimized.json where minimized.pt2 cannot be written,
which the loader takes back.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._higher_order_ops.while_loop import while_loop

from minify_contract.models import JobSpec, JobState
from minify_worker.engine import MinifyResult, minify
from minify_worker.programs.fx import graph as G
from minify_worker.programs.fx.prepare import prepare
from minify_worker.programs.prepared import PreparedProgram, ProgramError
from tests.support.backends import PREFIX
from tests.support.graphs import ops_of
from tests.support.repro import Repros
from tests.support.wire_programs import ReluInIntLoop, unsavable, write

pytestmark = pytest.mark.usefixtures("test_backends_allowed")


class IntLoopThenRelu(torch.nn.Module):
    """The same loop, relu after it: a failure that does not need the loop."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def more(i: int, value: torch.Tensor) -> Any:
            return i < 2

        def body(i: int, value: torch.Tensor) -> tuple[Any, torch.Tensor]:
            return i + 1, value.cos()

        return while_loop(more, body, (0, x.sin()))[1].tanh().relu()


@pytest.fixture(scope="module")
def int_loop(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """ReluInIntLoop as program.json and inputs.pt, written once for the module (a job only reads them)."""
    _, document, values = unsavable(ReluInIntLoop(), torch.randn(4, 8))
    return write(tmp_path_factory.mktemp("int_loop"), document, values)


def run(program: Path, inputs: Path, backend: str, out: Path) -> MinifyResult:
    spec = JobSpec.model_validate({
        "backend": backend, "program_format": "fx_json",
        "limits": {"candidate_timeout_s": 60, "parallelism": 2},
        # About programs torch.export.save refuses: the phases after minimality have their own tests.
        "culprit": False, "shrink": False, "versions": False,
    })
    return minify(program, spec, out, inputs=inputs)


@pytest.fixture(scope="module")
def repros() -> Repros:
    """The module's repro.py runs, each as `python repro.py` in a fork of the test process's one
    interpreter that ran their first imports (tests/support/repro.py), instead of one interpreter
    importing torch per repro."""
    return Repros()


# --- the loader ------------------------------------------------------------------------------


def test_prepare_reads_a_program_json_its_buffer_and_inputs_by_name(int_loop: tuple[Path, Path],
                                                                     tmp_path: Path) -> None:
    program, inputs = int_loop

    metadata = prepare(program, inputs, tmp_path)

    prepared = PreparedProgram.read(tmp_path)
    graph = G.graph_from_wire(prepared.wire_graph)
    assert metadata["source"] == "program.json" and metadata["why_not_pt2"].startswith("torch.export.save")
    assert metadata["buffers"] == ["b_scale"] and metadata["user_inputs"] == ["x"]
    assert [node.target for node in graph.nodes if node.op == "call_function"].count(
        torch.ops.higher_order.while_loop) == 1
    values = torch.load(tmp_path / "values.pt", weights_only=True)
    given = torch.load(inputs, weights_only=True)
    assert torch.equal(values["b_scale"], given["b_scale"]) and torch.equal(values["x"], given["x"])
    assert "mul" in values  # the eager run recorded the loop's input, promotable


def test_values_in_placeholder_order_are_taken_too(int_loop: tuple[Path, Path], tmp_path: Path) -> None:
    program, inputs = int_loop
    by_name = torch.load(inputs, weights_only=True)
    torch.save(tuple(by_name.values()), tmp_path / "ordered.pt")

    prepare(program, tmp_path / "ordered.pt", tmp_path / "work")

    values = torch.load(tmp_path / "work" / "values.pt", weights_only=True)
    assert torch.equal(values["x"], by_name["x"])


@pytest.mark.parametrize(("values", "reason"), [
    (lambda given: {"x": given["x"]}, "no value for placeholder b_scale"),
    (lambda given: {**given, "x": given["x"].double()}, "placeholder 'x' is a tensor [4, 8] float32, got"),
    (lambda given: {**given, "x": 3}, "placeholder 'x' is a tensor"),
    (lambda given: [given["x"]], "must be a dict of every placeholder's value by name"),
])
def test_inputs_that_do_not_fit_the_placeholders_are_refused_naming_them(
        int_loop: tuple[Path, Path], tmp_path: Path, values: Any, reason: str) -> None:
    program, inputs = int_loop
    torch.save(values(torch.load(inputs, weights_only=True)), tmp_path / "bad.pt")

    with pytest.raises(ProgramError, match=re.escape(reason)):
        prepare(program, tmp_path / "bad.pt", tmp_path / "work")


@pytest.mark.parametrize(("target", "reason"), [
    ("os.path.join", "target 'os.path.join' names a function of Python's os module"),  # the torch-free check
    ("aten.system.default", "unknown target 'aten.system.default'"),  # the allowlist
    ("builtins.exec", "target 'builtins.exec' is not one a program may call"),
])
def test_a_target_outside_the_allowlist_is_refused_before_anything_runs(
        int_loop: tuple[Path, Path], tmp_path: Path, target: str, reason: str) -> None:
    program, inputs = int_loop
    document = json.loads(program.read_text())
    call = next(node for node in document["graph"]["nodes"] if node["op"] == "call_function")
    call["target"] = target
    (tmp_path / "program.json").write_text(json.dumps(document))

    with pytest.raises(ProgramError, match="not a program.json minify can read: .*" + re.escape(reason)):
        prepare(tmp_path / "program.json", inputs, tmp_path / "work")
    assert not (tmp_path / "work" / "values.pt").exists()


def test_a_program_json_without_its_values_is_refused(int_loop: tuple[Path, Path], tmp_path: Path) -> None:
    with pytest.raises(ProgramError, match="needs its inputs file"):
        prepare(int_loop[0], None, tmp_path)


# --- through the engine ----------------------------------------------------------------------


def test_a_compile_error_inside_an_int_carrying_loop_keeps_the_loop_and_delivers_minimized_json(
        int_loop: tuple[Path, Path], tmp_path: Path, repros: Repros) -> None:
    result = run(*int_loop, f"{PREFIX}:fail_on_relu_in_subgraph", tmp_path / "out")

    assert result.status is JobState.succeeded, result.reason
    out = tmp_path / "out"
    code = result.report.graph_code or ""
    assert "torch.ops.higher_order.while_loop" in code and "relu" in ops_of(code)
    assert result.report.nodes_final < result.report.nodes_original
    assert not (out / "minimized.pt2").exists() and "minimized.pt2" in result.report.artifact_errors
    done = repros.run(out / "repro.py")
    assert done.returncode == 1, done.stderr[-3000:]
    assert "repro failed with: RuntimeError: injected failure on relu in a subgraph" in done.stderr, \
        done.stderr[-3000:]
    # minimized.json and inputs.pt are a program the loader takes back: the same graph.
    prepare(out / "minimized.json", out / "inputs.pt", tmp_path / "again")
    again = G.graph_from_wire(PreparedProgram.read(tmp_path / "again").wire_graph)
    assert G.graph_shape_hash(again) == result.report.graph_shape_hash


def test_a_runtime_error_after_an_int_carrying_loop_ends_as_the_one_op(tmp_path: Path) -> None:
    _, document, values = unsavable(IntLoopThenRelu(), torch.randn(4, 8))
    program, inputs = write(tmp_path / "c", document, values)

    result = run(program, inputs, f"{PREFIX}:fail_on_relu_at_runtime", tmp_path / "out")

    assert result.status is JobState.succeeded, result.reason
    assert result.report.signature == "RuntimeError: injected failure on relu"
    assert ops_of(result.report.graph_code or "") == ["relu"]
    assert (tmp_path / "out" / "minimized.pt2").exists()  # the loop is gone: torch.export.save writes the rest
