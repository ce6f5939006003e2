"""A failure only a compile for training has, in a graph with custom autograd.Functions, is captured
with the Functions' backward, and minimized (issue 38, pytorch#172956).

#172956: an autograd.Function whose backward writes into a tensor it saved, which its caller
also returns; compiled for training (an input requiring grad), AOT autograd's partitioner fails
on the joint graph (`AssertionError: Node add was invalid, but is output`). torch.export keeps a
Function's forward only, so an exported capture passed in the worker (`not_reproducible`), and the
capture then refused it. Now the graph dynamo handed the backend is lowered to aten ops with each
Function kept as `autograd_function_apply` over its lowered forward and backward
(`minify_client.capture.autograd_functions`), written as program.json, and the worker compiles it
for training: the same joint graph is traced and partitioned.

The family: Functions whose backward writes into the saved tensor (`add_`, `mul_`, `copy_`), and
one with two outputs, one of them marked non-differentiable, on `aot_eager_decomp_partition` (AOT
autograd and its partitioner, no compiler); a healthy Function beside a failing one, which the
minimization removes. And the other side of the line: a training compile that fails in the
forward's compiler, after the partition, is captured as a `.pt2` as before.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import fx

from minify_client.capture import capture_failures, crash, failed_graph
from minify_client.capture.failed_graph import Program
from minify_client.capture.program_file import GraphProgram
from minify_client.capture.session import CaptureSession
from minify_contract.models import JobSpec, JobState
from minify_worker.engine import minify
from tests.support.repro import run_repro


def _function(write: Callable[[torch.Tensor, torch.Tensor], Any], name: str) -> type[torch.autograd.Function]:
    def forward(ctx: Any, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(offsets)
        return x * 2

    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (offsets,) = ctx.saved_tensors
        write(offsets, grad)
        return grad.clone(), None

    methods = {"forward": staticmethod(forward), "backward": staticmethod(backward)}
    return type(name, (torch.autograd.Function,), methods)


BumpSaved = _function(lambda saved, grad: saved.add_(grad), "BumpSaved")
ScaleSaved = _function(lambda saved, grad: saved.mul_(grad), "ScaleSaved")
OverwriteSaved = _function(lambda saved, grad: saved.copy_(grad), "OverwriteSaved")


class BumpWithIndex(torch.autograd.Function):
    """Two outputs, the second (an index) marked non-differentiable; the backward writes into the
    saved input."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        index = x.argmax()
        ctx.mark_non_differentiable(index)
        ctx.save_for_backward(x)
        return x * 2, index

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, grad_index: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        x.add_(grad)
        return grad.clone()


class Sine(torch.autograd.Function):
    """A healthy Function: sin, with its true derivative."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return torch.sin(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad * torch.cos(x)


def bump_saved(x: torch.Tensor) -> Any:
    offsets = x.clone()
    return BumpSaved.apply(x, offsets).clone(), offsets


def scale_saved(x: torch.Tensor) -> Any:
    offsets = x.clone()
    return ScaleSaved.apply(x, offsets).clone(), offsets


def overwrite_saved(x: torch.Tensor) -> Any:
    offsets = x.clone()
    return OverwriteSaved.apply(x, offsets).clone(), offsets


def bump_with_index(x: torch.Tensor) -> Any:
    y = x.clone()
    doubled, index = BumpWithIndex.apply(y)
    return doubled.clone(), index, y


def healthy_then_bump(x: torch.Tensor) -> Any:
    offsets = Sine.apply(x) + 1
    return BumpSaved.apply(x, offsets).clone(), offsets


# Each: the program, the Function, and the op its backward writes with.
FAMILY = {"add_": (bump_saved, "BumpSaved", "aten.add_.Tensor"),
          "mul_": (scale_saved, "ScaleSaved", "aten.mul_.Tensor"),
          "copy_": (overwrite_saved, "OverwriteSaved", "aten.copy_.default"),
          "non-differentiable output": (bump_with_index, "BumpWithIndex", "aten.add_.Tensor")}
PARTITIONER = "Node .* was invalid, but is output"
FUNCTION_OP = "higher_order.autograd_function_apply"


def _targets(wire: dict[str, Any]) -> list[str]:
    """Every call_function target of a wire graph, its subgraphs' included."""
    found = []
    for node in wire["nodes"]:
        found += [node["target"]] if node["op"] == "call_function" else []
        found += _targets(node["subgraph"]) if "subgraph" in node else []
    return found


def _capture(tmp_path: Path, program: Callable[[torch.Tensor], Any], x: torch.Tensor, *,
             dynamic: bool | None = None) -> JobSpec:
    torch._dynamo.reset()
    with pytest.raises(Exception, match=PARTITIONER) as raised, capture_failures(
            torch.nn.Identity(), (x,), save_to=tmp_path, name="program") as block:
        torch.compile(program, backend="aot_eager_decomp_partition", fullgraph=True, dynamic=dynamic)(x)
    assert block.captured is not None, block.capture_error
    notes = getattr(raised.value, "__notes__", [])
    assert any("captured with static shapes" in note for note in notes) == bool(dynamic), notes
    return JobSpec.model_validate_json((tmp_path / "spec.json").read_text())


@pytest.mark.parametrize("name", FAMILY)
def test_a_partitioner_failure_in_a_function_is_captured_with_its_backward(name: str, tmp_path: Path) -> None:
    program, function, write = FAMILY[name]
    x = torch.randn(16, requires_grad=True)
    before = x.detach().clone()

    spec = _capture(tmp_path, program, x)

    assert (spec.program_format, spec.backend, spec.failure.kind, spec.failure.training) == (
        "fx_json", "aot_eager_decomp_partition", "compile_error", True)
    assert (tmp_path / "program.json").is_file() and not (tmp_path / "program.pt2").exists()
    document = json.loads((tmp_path / "program.json").read_text())
    assert function in document["why"]  # why it is not a .pt2, by the Function's name
    targets = _targets(document["graph"])
    assert FUNCTION_OP in targets and write in targets  # the backward's write is in the program
    assert torch.equal(x.detach(), before) and x.grad is None  # the user's tensor as it was
    assert list(torch.load(tmp_path / "inputs.pt", weights_only=True)) == [
        node["name"] for node in document["graph"]["nodes"] if node["op"] == "placeholder"]


def test_the_script_runner_captures_it_as_program_json(tmp_path: Path) -> None:
    """The runner's session (`python -m minify_client.capture`) writes the entry; the user's
    error is raised as it was."""
    session = CaptureSession(tmp_path)
    session.start()
    torch._dynamo.reset()
    try:
        session.begin("script.py")
        x = torch.randn(16, requires_grad=True)
        with pytest.raises(Exception, match=PARTITIONER) as raised:
            torch.compile(bump_saved, backend="aot_eager_decomp_partition", fullgraph=True)(x)
        entries = session.finish(raised.value)
    finally:
        session.stop()

    assert [Path(entry.program).suffix for entry in entries] == [".json"]
    assert (tmp_path / entries[0].program).is_file()


@pytest.mark.parametrize("dynamic", [None, True], ids=["static", "dynamic"])
def test_the_failing_function_is_what_the_minimal_program_keeps(tmp_path: Path, dynamic: bool | None) -> None:
    """A healthy Function (sin) feeds the failing one: the minimal program keeps the failing
    Function and its backward's write, and not the healthy one; repro.py fails as the user's
    program did, and the minimal program is minimized.json (a .pt2 would drop the backward).
    Compiled with symbolic sizes, the program is captured static (the note says so); the
    partitioner then names its node `add` where the user's compile said `add_6`, one signature."""
    spec = _capture(tmp_path, healthy_then_bump, torch.randn(16, requires_grad=True), dynamic=dynamic)
    assert spec.dynamic == ("static" if dynamic else "as_exported")

    done = minify(tmp_path / "program.json", spec.model_copy(update={"culprit": False, "versions": False}),
                  tmp_path / "out", inputs=tmp_path / "inputs.pt")

    assert done.status is JobState.succeeded, done.reason
    assert done.report.signature == spec.failure.signature
    code = done.report.graph_code or ""
    assert "autograd_function_apply" in code and "add_" in code and "sin" not in code, code
    assert done.report.nodes_final < done.report.nodes_original
    assert (tmp_path / "out" / "minimized.json").is_file() and not (tmp_path / "out" / "minimized.pt2").exists()
    ran = run_repro(tmp_path / "out" / "repro.py")
    assert ran.returncode != 0 and f"repro failed with: {spec.failure.signature}" in ran.stderr, ran.stderr[-2000:]


def test_a_function_that_cannot_be_kept_is_refused_with_its_reason(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the lowering fails, nothing is written and the reason says what would be lost."""
    def cannot_lower(module: Any, inputs: Any) -> Any:
        raise RuntimeError("make_fx cannot trace this graph")

    monkeypatch.setattr(failed_graph, "lower_keeping_functions", cannot_lower)
    torch._dynamo.reset()
    x = torch.randn(16, requires_grad=True)
    with pytest.raises(Exception, match=PARTITIONER) as raised, capture_failures(
            torch.nn.Identity(), (x,), save_to=tmp_path, name="program") as block:
        torch.compile(bump_saved, backend="aot_eager_decomp_partition", fullgraph=True)(x)

    assert block.captured is None
    reason = str(block.capture_error)
    assert "AOT autograd's partitioner" in reason and "autograd.Function (BumpSaved)" in reason
    assert "make_fx cannot trace this graph" in reason and "keeps a Function's forward only" in reason
    assert "Next: TORCH_LOGS=aot_joint_graph" in reason  # what the user can do
    assert any("not captured" in note for note in getattr(raised.value, "__notes__", []))
    assert not any(tmp_path.iterdir())


def test_a_crash_capture_pending_as_program_json_is_adopted_as_one(tmp_path: Path) -> None:
    """A crash capture's pending folder holds what the capture would write (here program.json);
    adopting it names the file after the capture, suffix kept."""
    module = fx.symbolic_trace(torch.nn.ReLU())
    module.graph.eliminate_dead_code()
    from torch.fx.experimental.proxy_tensor import make_fx

    lowered = make_fx(module, tracing_mode="fake")(torch.randn(3))
    spec = JobSpec.model_validate({"backend": "inductor", "failure": {"kind": "crash"}})
    program = Program(GraphProgram(lowered, "a test's reason"), (torch.randn(3),), {}, spec, ())

    folder = crash.write_pending(tmp_path, program, test="t.py::test", key="k", level="dynamo", backend="inductor")
    (pending,) = crash.pending(tmp_path)
    assert pending.folder == folder and pending.program == "program.json"
    assert json.loads((folder / "spec.json").read_text())["program_format"] == "fx_json"
    crash.move_into(pending, tmp_path / "capture", "capture", "SIGSEGV")

    assert sorted(path.name for path in (tmp_path / "capture").iterdir()) == ["capture.json", "inputs.pt", "spec.json"]


def _fail_on_mul(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
    if any(node.op == "call_function" and "mul" in str(node.target) for node in gm.graph.nodes):
        raise RuntimeError("injected failure on mul in the forward's compiler")
    return gm


def fails_in_the_forward_compiler(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
    """A torch.compile backend: AOT autograd (partitioned), whose forward compiler fails on mul."""
    from torch._dynamo.backends.common import aot_autograd

    return aot_autograd(fw_compiler=_fail_on_mul)(gm, example_inputs)


def test_a_training_compile_that_fails_after_the_partition_is_still_captured(tmp_path: Path) -> None:
    torch._dynamo.reset()
    x = torch.randn(16, requires_grad=True)

    with pytest.raises(Exception, match="injected failure on mul"), capture_failures(
            torch.nn.Identity(), (x,), save_to=tmp_path, name="program") as block:
        torch.compile(lambda t: (t * 2).sin(), backend=fails_in_the_forward_compiler)(x)

    assert block.captured is not None, block.capture_error
    assert (tmp_path / "program.pt2").is_file()
