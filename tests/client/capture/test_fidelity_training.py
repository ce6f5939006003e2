"""A failure only a compile for training has is not captured as a program that cannot have it
(issue 38, pytorch#172956).

#172956: an autograd.Function whose backward writes into a tensor it saved, which its caller
also returns; compiled for training (an input requiring grad), AOT autograd's partitioner fails
on the joint graph (`AssertionError: Node add was invalid, but is output`). The capture saved the
graph dynamo handed the backend, exported: the Function's forward only (torch.export keeps no
custom backward), which the worker compiles for inference, where nothing is partitioned. It passed
3x and the job ended `not_reproducible`. The capture now says why at once, and saves nothing
(`minify_client.capture.fidelity`); the user's program raises what it raised.

The family: three Functions whose backward writes into the saved tensor (`add_`, `mul_`,
`copy_`), on `aot_eager_decomp_partition` (AOT autograd and its partitioner, no compiler). And
the other side of the line: a training compile that fails in the forward's compiler, after the
partition, is captured as before.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import fx

from minify_client.capture import capture_failures
from minify_client.capture.session import CaptureSession


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


def bump_saved(x: torch.Tensor) -> Any:
    offsets = x.clone()
    return BumpSaved.apply(x, offsets).clone(), offsets


def scale_saved(x: torch.Tensor) -> Any:
    offsets = x.clone()
    return ScaleSaved.apply(x, offsets).clone(), offsets


def overwrite_saved(x: torch.Tensor) -> Any:
    offsets = x.clone()
    return OverwriteSaved.apply(x, offsets).clone(), offsets


FAMILY = {"add_": (bump_saved, "BumpSaved"), "mul_": (scale_saved, "ScaleSaved"),
          "copy_": (overwrite_saved, "OverwriteSaved")}
PARTITIONER = "Node .* was invalid, but is output"


@pytest.mark.parametrize("name", FAMILY)
def test_a_partitioner_failure_of_a_training_compile_is_refused_with_its_reason(name: str, tmp_path: Path) -> None:
    program, function = FAMILY[name]
    torch._dynamo.reset()
    x = torch.randn(16, requires_grad=True)

    with pytest.raises(Exception, match=PARTITIONER) as raised, capture_failures(
            torch.nn.Identity(), (x,), save_to=tmp_path, name="program") as block:
        torch.compile(program, backend="aot_eager_decomp_partition", fullgraph=True)(x)

    assert block.captured is None
    reason = str(block.capture_error)
    assert "AOT autograd's partitioner" in reason and "keeps a Function's forward only" in reason
    assert f"autograd.Function ({function})" in reason  # what would be lost, by name
    assert "Next: TORCH_LOGS=aot_joint_graph" in reason  # what the user can do
    assert any("not captured" in note for note in getattr(raised.value, "__notes__", []))
    assert not (tmp_path / "program.pt2").exists()


def test_the_script_runner_says_so_in_place_of_a_capture(tmp_path: Path) -> None:
    """The runner's session (`python -m minify_client.capture`) notes it on the error and writes
    no entry: a job that would end not_reproducible is never made."""
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

    assert entries == []
    assert any("AOT autograd's partitioner" in note for note in raised.value.__notes__)


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
