"""Capture of graphs that hold higher-order ops (issue 38, item 4).

A compiled `torch.cond`, `while_loop`, `scan`, `map`, `associative_scan`, `nested_compile_region`,
`torch.utils.checkpoint` or `wrap` is captured with its subgraphs, loads in the worker and gives the
eager values; `flex_attention`, which torch 2.13 cannot save, is captured as program.json
(tests/client/capture/test_capture_wire.py). The test backends (tests/support/backends.py) fail on
relu anywhere, or only on relu inside a subgraph (a failure that needs the op).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch._dynamo.exc import BackendCompilerFailed
from torch._higher_order_ops.associative_scan import associative_scan
from torch._higher_order_ops.map import map as map_hop
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop
from torch._higher_order_ops.wrap import wrap

from minify_client.capture import capture, capture_failures
from minify_client.capture.higher_order import CaptureRefused
from minify_contract.models import JobSpec, JobState
from minify_worker.engine import minify
from minify_worker.programs.fx import graph as G
from minify_worker.programs.fx.prepare import prepare
from minify_worker.programs.prepared import PreparedProgram
from tests.support.backends import fail_on_relu_anywhere, fail_on_relu_in_subgraph
from tests.support.graphs import ops_of, targets_of

WEIGHT = torch.nn.Parameter(torch.linspace(0.5, 1.5, 4))


def in_cond(x: torch.Tensor) -> torch.Tensor:
    return torch.cond(x.sum() > 0, lambda a: torch.relu(a).cos(), lambda a: a.sin(), (x,)).exp()


def in_while_loop(x: torch.Tensor) -> torch.Tensor:
    def more(i: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        return i < 3

    def body(i: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return i + 1, torch.relu(value.cos())

    return while_loop(more, body, (torch.zeros((), dtype=torch.int64), x))[1].exp()


def in_scan(x: torch.Tensor) -> torch.Tensor:
    def step(carry: torch.Tensor, row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        new = torch.relu(carry + row)
        return new, new.sin()

    return scan(step, torch.zeros(4), x)[1].exp()


def in_map(x: torch.Tensor) -> torch.Tensor:
    return map_hop(lambda row: torch.relu(row).cos(), x).exp()


def in_associative_scan(x: torch.Tensor) -> torch.Tensor:
    # The generic mode (the pointwise one needs CUDA) vmaps the combine function: transform calls.
    return associative_scan(lambda a, b: torch.relu(a + b), x, dim=0, combine_mode="generic").exp()


@torch.compiler.nested_compile_region
def region(a: torch.Tensor) -> torch.Tensor:
    return torch.relu(a).cos()


def in_nested_compile_region(x: torch.Tensor) -> torch.Tensor:
    return region(x) + region(x.sin())


def in_checkpoint(x: torch.Tensor) -> torch.Tensor:
    def block(a: torch.Tensor) -> torch.Tensor:
        return torch.relu(a * WEIGHT).cos()

    return torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False).sum()


def in_wrap(x: torch.Tensor) -> torch.Tensor:
    return wrap(lambda a: torch.relu(a).cos(), x).exp()


# Each program, and the higher-order op its loaded graph holds (None: export inlines it or lowers it).
PROGRAMS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], str | None]] = {
    "cond": (in_cond, "higher_order.cond"),
    "while_loop": (in_while_loop, "higher_order.while_loop"),
    "scan": (in_scan, "higher_order.scan"),
    "map": (in_map, "higher_order.map_impl"),
    "associative_scan": (in_associative_scan, None),
    "nested_compile_region": (in_nested_compile_region, "higher_order.invoke_subgraph"),
    "checkpoint": (in_checkpoint, "higher_order.tag_activation_checkpoint"),
    "wrap": (in_wrap, None),
}


def captured_program(program: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, directory: Path,
                     backend: Callable[..., object] = fail_on_relu_anywhere) -> capture_failures:
    torch._dynamo.reset()
    with contextlib.suppress(BackendCompilerFailed), capture_failures(
            torch.nn.Module(), (x,), save_to=directory) as block:
        torch.compile(program, backend=backend)(x)
        raise AssertionError("the compile did not fail")
    return block


def x_for(name: str) -> torch.Tensor:
    return torch.ones(3, 4) if name == "cond" else torch.randn(3, 4)  # the cond takes its relu branch


@pytest.mark.parametrize("name", PROGRAMS)
def test_a_compiled_higher_order_op_is_captured_with_its_subgraphs_and_loads_in_the_worker(
        name: str, tmp_path: Path) -> None:
    program, op = PROGRAMS[name]
    x = x_for(name)

    block = captured_program(program, x, tmp_path / "c")

    assert block.capture_error is None and block.captured is not None
    args, _ = torch.load(tmp_path / "c" / "inputs.pt", weights_only=True)
    (result,) = torch.export.load(block.captured.program).module()(*args)
    torch.testing.assert_close(result, program(x))
    prepare(block.captured.program, tmp_path / "c" / "inputs.pt", tmp_path / "work")
    loaded = G.graph_from_wire(PreparedProgram.read(tmp_path / "work").wire_graph)
    held = {target for target in targets_of(loaded) if target.startswith("higher_order.")}
    assert held == ({op} if op else set())
    relu_inside = any("relu" in ops_of(G.subgraph_of(node)) for node in G.subgraphs(loaded))
    assert "relu" in ops_of(loaded) or relu_inside


def score_mod_relu(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_index: torch.Tensor,
                   kv_index: torch.Tensor) -> torch.Tensor:
    return torch.relu(score) + (q_index - kv_index)


def in_flex_attention(q: torch.Tensor) -> torch.Tensor:
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, q.cos(), q.sin(), score_mod=score_mod_relu)


def test_flex_attention_which_torch_cannot_save_is_captured_as_program_json_and_the_users_error_stands(
        tmp_path: Path) -> None:
    torch._dynamo.reset()
    with pytest.raises(BackendCompilerFailed, match="injected failure on relu") as raised, capture_failures(
            torch.nn.Module(), (torch.randn(1, 2, 16, 8),), save_to=tmp_path / "c") as block:
        torch.compile(in_flex_attention, backend=fail_on_relu_anywhere)(torch.randn(1, 2, 16, 8))

    assert block.capture_error is None and block.captured is not None
    assert block.captured.program == tmp_path / "c" / "Module.json"  # tests/client/capture/test_capture_wire.py
    assert any("Module.json" in note for note in raised.value.__notes__)
    assert not list(tmp_path.glob("c/*.pt2"))


class FlexAttention(torch.nn.Module):
    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return in_flex_attention(q)


def test_the_whole_model_capture_refuses_flex_attention_when_program_json_cannot_hold_it_either(
        tmp_path: Path) -> None:
    # torch.export of the module itself (not dynamo's graph) calls a Python function
    # (`lazy_load_decompositions`), which no program file can name.
    with pytest.raises(CaptureRefused, match=r"torch.export.save cannot write.*flex_attention.*program.json cannot "
                                             r"hold it either.*lazy_load_decompositions"):
        capture(FlexAttention(), (torch.randn(1, 2, 16, 8),), save_to=tmp_path / "c")

    assert not list(tmp_path.glob("c/*.pt2")) and not list(tmp_path.glob("c/*.json"))


# --- through the engine ---------------------------------------------------------------------------


def minified(directory: Path, out: Path) -> object:
    spec = JobSpec.model_validate({
        **json.loads((directory / "spec.json").read_text()),
        "limits": {"candidate_timeout_s": 60, "parallelism": 2}, "culprit": False, "versions": False,
    })
    (program,) = directory.glob("*.pt2")
    return minify(program, spec, out, inputs=directory / "inputs.pt")


@pytest.mark.usefixtures("test_backends_allowed")
@pytest.mark.parametrize("name", ["checkpoint", "nested_compile_region", "cond"])
def test_a_captured_bug_in_a_subgraph_that_needs_no_op_ends_inlined_as_the_op(name: str, tmp_path: Path) -> None:
    program, _ = PROGRAMS[name]
    captured_program(program, x_for(name), tmp_path / "c")

    result = minified(tmp_path / "c", tmp_path / "out")

    assert result.status is JobState.succeeded, result.reason
    code = result.report.graph_code or ""
    assert ops_of(code) == ["relu"] and "higher_order" not in code


@pytest.mark.usefixtures("test_backends_allowed")
def test_a_captured_bug_that_needs_the_checkpoint_keeps_it_and_minimized_pt2_loads(tmp_path: Path) -> None:
    captured_program(in_checkpoint, torch.randn(3, 4), tmp_path / "c", fail_on_relu_in_subgraph)

    result = minified(tmp_path / "c", tmp_path / "out")

    assert result.status is JobState.succeeded, result.reason
    code = result.report.graph_code or ""
    assert "torch.ops.higher_order.tag_activation_checkpoint" in code and ops_of(code) == ["relu"]
    minimized = torch.export.load(tmp_path / "out" / "minimized.pt2")
    minimized.module()(*torch.load(tmp_path / "out" / "inputs.pt", weights_only=True))
