"""Dynamic captures stay dynamic (issue 30, point 2).

A failing graph compiled with symbolic sizes (`torch.compile(dynamic=True)`, or automatic
dynamic's recompile) is captured with them: its program has range constraints, its size inputs
are dims of the tensors they size, and a bug that shows only on symbolic sizes (the test backend
`fail_on_symbolic_relu`) still reproduces after capture, minimization and in repro.py. Cheap
backends only, no inductor.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._sympy.numbers import int_oo

from minify_client.capture import capture_failures
from minify_client.capture.failed_graph import exported
from minify_client.capture.session import CaptureSession
from minify_client.capture.torch_hooks import FailedCompile
from minify_contract.models import JobSpec, JobState
from minify_worker.engine import MinifyResult, minify
from minify_worker.programs.fx.backends import ALLOWED_BACKENDS_ENV
from tests.support.backends import PREFIX, fail_on_symbolic_relu
from tests.support.repro import run_repro

SIGNATURE = "RuntimeError: injected failure on relu with symbolic sizes"


def scaled_relu(x: torch.Tensor) -> torch.Tensor:
    """Uses its batch size as a number: dynamo lifts it to a size input."""
    return torch.cos(torch.relu(torch.sin(x)) * x.shape[0])


def times(x: torch.Tensor, n: int) -> torch.Tensor:
    return torch.relu(x) * n


def compile_and_capture(function: Any, directory: Path, *args: Any, dynamic: bool | None = True) -> Path:
    """Call `torch.compile(function, dynamic=...)` on `args` under a capture into `directory`,
    expecting the compile to fail; the captured program's path."""
    torch._dynamo.reset()
    with pytest.raises(Exception, match="injected failure on relu with symbolic sizes"), capture_failures(
        torch.nn.Identity(), args, save_to=directory, name="program"
    ):
        torch.compile(function, backend=fail_on_symbolic_relu, dynamic=dynamic)(*args)
    return directory / "program.pt2"


def user_inputs(program: torch.export.ExportedProgram) -> list[Any]:
    """The `val` of each user input's placeholder (a tensor's fake value, or a SymInt)."""
    names = set(program.graph_signature.user_inputs)
    return [node.meta["val"] for node in program.graph.nodes if node.op == "placeholder" and node.name in names]


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`scaled_relu` compiled with dynamic=True on an (8, 16) input, captured."""
    return compile_and_capture(scaled_relu, tmp_path_factory.mktemp("captured"), torch.randn(8, 16))


@pytest.fixture(scope="module")
def minimized(captured: Path) -> MinifyResult:
    """The capture minimized by the offline engine, with its spec and inputs as saved."""
    spec = JobSpec.model_validate_json((captured.parent / "spec.json").read_text())
    spec = spec.model_copy(update={"limits": spec.limits.model_copy(update={"parallelism": 2}), "culprit": False})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ALLOWED_BACKENDS_ENV, PREFIX)
        return minify(captured, spec, captured.parent / "out", inputs=captured.parent / "inputs.pt")


# ---------------------------------------------------------------------------------------------
# The captured program


def test_a_dynamic_compile_is_captured_with_its_symbolic_dims(captured: Path) -> None:
    program = torch.export.load(captured)

    assert [bound.lower for bound in program.range_constraints.values()] == [2, 2]  # dynamo's, for sizes
    (x,) = user_inputs(program)
    assert all(isinstance(size, torch.SymInt) for size in x.shape)  # dynamic=True: every dim


def test_a_range_unbounded_above_is_captured_unbounded(captured: Path) -> None:
    program = torch.export.load(captured)

    assert [bound.upper for bound in program.range_constraints.values()] == [int_oo, int_oo]


def test_a_size_input_becomes_the_dim_of_the_tensor_it_sizes(captured: Path) -> None:
    program = torch.export.load(captured)
    (args, kwargs) = torch.load(captured.parent / "inputs.pt")

    assert [type(value) for value in args] == [torch.Tensor] and kwargs == {}  # no int input left
    x = torch.randn(5, 16)  # another batch size: the program is not specialized to 8
    torch.testing.assert_close(program.module()(x)[0], scaled_relu(x))


def test_a_free_int_input_stays_a_dynamic_int(tmp_path: Path) -> None:
    program = torch.export.load(compile_and_capture(times, tmp_path, torch.randn(3, 4), 5))

    x, n = user_inputs(program)
    assert isinstance(n, torch.SymInt) and isinstance(x.shape[0], torch.SymInt)
    torch.testing.assert_close(program.module()(torch.randn(6, 4), 7)[0].shape, torch.Size([6, 4]))


class DropoutRelu(torch.nn.Module):
    """Floats a backend other than inductor receives symbolic under dynamic=True (p, eps)."""

    def __init__(self) -> None:
        super().__init__()
        self.dropout, self.eps = torch.nn.Dropout(0.1), 1e-5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.dropout(x)) + self.eps


def test_floats_dynamo_made_symbolic_are_captured_as_their_values(tmp_path: Path) -> None:
    """Export cannot take dropout's check of a symbolic `p`: the values are constants, the dims stay."""
    program = torch.export.load(compile_and_capture(DropoutRelu().eval(), tmp_path, torch.randn(4, 3)))

    (x,) = user_inputs(program)  # the two floats' 0-d tensors are gone
    assert all(isinstance(size, torch.SymInt) for size in x.shape)
    y = torch.randn(6, 3)
    torch.testing.assert_close(program.module()(y)[0], torch.relu(y) + 1e-5)


def test_a_sum_of_sizes_is_captured_as_additions_torch_can_save(tmp_path: Path) -> None:
    # dynamo makes `sum()` over sizes a torch.sym_sum node, which torch.export.save cannot write
    program = torch.export.load(compile_and_capture(lambda x: torch.relu(x.new_ones(sum([1, x.shape[0]]))),
                                                    tmp_path, torch.randn(8, 16)))

    assert program.range_constraints
    torch.testing.assert_close(program.module()(torch.randn(5, 16))[0], torch.ones(6))


def test_an_automatic_dynamic_recompile_is_captured_as_the_dynamic_graph_that_failed(tmp_path: Path) -> None:
    torch._dynamo.reset()
    compiled = torch.compile(scaled_relu, backend=fail_on_symbolic_relu)
    compiled(torch.randn(8, 16))  # the first compile is static: it passes
    with pytest.raises(Exception, match="with symbolic sizes"), capture_failures(
        torch.nn.Identity(), (), save_to=tmp_path, name="program"
    ):
        compiled(torch.randn(12, 16))  # a new batch size: recompiled with a symbolic batch

    program = torch.export.load(tmp_path / "program.pt2")
    assert program.range_constraints
    (x,) = user_inputs(program)
    assert isinstance(x.shape[0], torch.SymInt)


def test_a_guard_a_named_dim_cannot_say_is_left_to_export(tmp_path: Path) -> None:
    """`view(2, -1)` needs an even size: export refuses `Dim(min=2)` for it, takes `Dim.DYNAMIC`."""
    program = torch.export.load(compile_and_capture(lambda x: torch.relu(x.view(2, -1)), tmp_path,
                                                    torch.randn(6)))

    assert [bound.lower for bound in program.range_constraints.values()] == [2]  # the compile's range kept
    assert JobSpec.model_validate_json((tmp_path / "spec.json").read_text()).dynamic == "as_exported"


def data_dependent_failure() -> FailedCompile:
    """An input sized by a data-dependent value (an unbacked symbol) has no example size."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    shape_env = ShapeEnv()
    with FakeTensorMode(shape_env=shape_env):
        fake = torch.empty(shape_env.create_unbacked_symint(), 4)
    graph = torch.fx.symbolic_trace(lambda x: torch.relu(x))
    return FailedCompile(level="aot", error=RuntimeError("injected failure on relu"), backend="inductor",
                         config={}, graph=graph, inputs=[torch.randn(3, 4)], symbolic=[fake])


def test_a_graph_whose_sizes_no_export_can_take_is_captured_static_and_says_why() -> None:
    failed = data_dependent_failure()
    error = failed.error

    program = exported(failed)

    assert program.program.range_constraints == {}
    assert program.static_reason is not None and "data-dependent" in program.static_reason
    assert program.spec.dynamic == "static"
    assert any("captured with static shapes" in note for note in error.__notes__)


def test_the_manifest_says_why_a_capture_is_static(tmp_path: Path) -> None:
    session = CaptureSession(tmp_path)
    session.begin("test_data_dependent")
    session.on_failure(data_dependent_failure())

    session.finish()

    [entry] = json.loads((tmp_path / "captures.json").read_text())["captures"]
    assert "data-dependent" in entry["static_reason"]


# ---------------------------------------------------------------------------------------------
# Minimized, and reproduced


def test_a_bug_only_symbolic_sizes_show_is_minimized_from_its_capture(minimized: MinifyResult) -> None:
    assert minimized.status is JobState.succeeded, minimized.reason
    assert minimized.report.signature == SIGNATURE
    ops = [line.split("torch.ops.aten.")[1].split(".")[0] for line in (minimized.report.graph_code or "").splitlines()
           if "torch.ops.aten." in line]
    assert ops == ["relu"]


def test_the_minimized_program_keeps_the_dynamic_dim(minimized: MinifyResult) -> None:
    program = torch.export.load(minimized.artifacts["minimized.pt2"])

    assert program.range_constraints
    (x,) = user_inputs(program)
    assert isinstance(x.shape[0], torch.SymInt)


def test_the_repro_of_a_captured_dynamic_bug_reproduces_with_its_dynamic_dims(minimized: MinifyResult) -> None:
    repro = minimized.artifacts["repro.py"]
    done = run_repro(repro)

    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert f"repro failed with: {SIGNATURE}" in done.stderr
    dims = ast.literal_eval(repro.read_text().split("DYNAMIC_DIMS = ", 1)[1].split("\n]", 1)[0] + "\n]")
    assert any(dims), dims  # some input's dim is dynamic
