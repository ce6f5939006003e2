"""A failing graph torch.export.save cannot write is captured as program.json (capture/program_file.py).

Two reasons torch 2.13 refuses: a `while_loop` carrying a Python int (pytorch#166525: "Unsupported
list/tuple argument type") and `flex_attention` (its block-mask tuple). Either is captured as
`<name>.json` with every placeholder's value in inputs.pt by name, its spec saying `fx_json`; the
user's error stands, and a wrong result stays what the compiled program returned. The worker
minimizes such a capture (flex_attention here; the loop in
tests/worker/programs/fx/test_wire_programs.py). The test backends: tests/support/backends.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._dynamo.exc import BackendCompilerFailed
from torch._higher_order_ops.while_loop import while_loop

from minify_client.capture import capture_failures
from minify_contract.models import JobSpec, JobState
from minify_contract.program_json import FORMAT, read_document
from minify_worker.engine import minify
from tests.support.backends import PREFIX, fail_on_relu_anywhere, wrong_on_relu
from tests.support.graphs import ops_of


def in_int_loop(x: torch.Tensor) -> torch.Tensor:
    def more(i: int, value: torch.Tensor) -> Any:
        return i < 3

    def body(i: int, value: torch.Tensor) -> tuple[Any, torch.Tensor]:
        return i + 1, torch.relu(value.cos())

    return while_loop(more, body, (0, x))[1].exp()


def score_mod_relu(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_index: torch.Tensor,
                   kv_index: torch.Tensor) -> torch.Tensor:
    return torch.relu(score)


def in_flex_attention(q: torch.Tensor) -> torch.Tensor:
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, q.cos(), q.sin(), score_mod=score_mod_relu)


def int_loop_then_relu(x: torch.Tensor) -> torch.Tensor:
    def more(i: int, value: torch.Tensor) -> Any:
        return i < 2

    def body(i: int, value: torch.Tensor) -> tuple[Any, torch.Tensor]:
        return i + 1, value.cos()

    return torch.relu(while_loop(more, body, (0, x.sin()))[1])


PROGRAMS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[], torch.Tensor], str]] = {
    "int_loop": (in_int_loop, lambda: torch.randn(3, 4), "while_loop"),
    "flex_attention": (in_flex_attention, lambda: torch.randn(1, 2, 16, 8), "flex_attention"),
}


def captured_failure(program: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                     directory: Path) -> tuple[capture_failures, BaseException]:
    torch._dynamo.reset()
    with pytest.raises(BackendCompilerFailed, match="injected failure on relu") as raised, capture_failures(
            torch.nn.Module(), (x,), save_to=directory) as block:
        torch.compile(program, backend=fail_on_relu_anywhere)(x)
    return block, raised.value


@pytest.mark.parametrize("name", PROGRAMS)
def test_a_graph_torch_cannot_save_is_captured_as_program_json_and_the_users_error_stands(
        name: str, tmp_path: Path) -> None:
    program, make_input, op = PROGRAMS[name]
    x = make_input()
    before = x.clone()

    block, error = captured_failure(program, x, tmp_path / "c")

    assert block.capture_error is None and block.captured is not None
    path = block.captured.program
    assert path is not None and path.name == "Module.json" and not list((tmp_path / "c").glob("*.pt2"))
    document = read_document(path.read_bytes())
    assert document["format"] == FORMAT and document["torch_version"] == torch.__version__
    assert op in document["why"] and document["why"].startswith(("torch.export.save cannot write",
                                                                   "torch.export.load cannot read back"))
    spec = JobSpec.model_validate_json((tmp_path / "c" / "spec.json").read_text())
    assert spec.program_format == "fx_json" and block.captured.spec.program_format == "fx_json"
    values = torch.load(tmp_path / "c" / "inputs.pt", weights_only=True)
    placeholders = [node["name"] for node in document["graph"]["nodes"] if node["op"] == "placeholder"]
    assert isinstance(values, dict) and list(values) == placeholders
    assert torch.equal(x, before)  # the user's input is as it was
    assert any("Module.json" in note for note in error.__notes__)


def test_a_wrong_result_of_an_int_carrying_loop_is_captured_as_program_json_and_returned_unchanged(
        tmp_path: Path) -> None:
    x = torch.randn(3, 4)
    torch._dynamo.reset()
    uncaptured = torch.compile(int_loop_then_relu, backend=wrong_on_relu)(x)
    torch._dynamo.reset()

    with capture_failures(int_loop_then_relu, (x,), save_to=tmp_path / "c", accuracy=True, exceptions=()) as block:
        result = torch.compile(int_loop_then_relu, backend=wrong_on_relu)(x)
    torch._dynamo.reset()

    torch.testing.assert_close(result, uncaptured)  # what the compiled program returned, capture or not
    assert not torch.allclose(result, int_loop_then_relu(x))
    assert block.capture_error is None and block.captured is not None
    assert block.captured.program is not None and block.captured.program.suffix == ".json"
    spec = json.loads((tmp_path / "c" / "spec.json").read_text())
    assert spec["program_format"] == "fx_json" and spec["failure"]["kind"] == "accuracy"


@pytest.mark.usefixtures("test_backends_allowed")
def test_a_captured_flex_attention_is_minimized_to_the_op_inside_its_score_mod(tmp_path: Path) -> None:
    program, make_input, _ = PROGRAMS["flex_attention"]
    block, _ = captured_failure(program, make_input(), tmp_path / "c")
    assert block.captured is not None and block.captured.program is not None
    spec = JobSpec.model_validate({
        **json.loads((tmp_path / "c" / "spec.json").read_text()), "backend": f"{PREFIX}:fail_on_relu_anywhere",
        "limits": {"candidate_timeout_s": 60, "parallelism": 2}, "culprit": False, "shrink": False,
        "versions": False,
    })

    result = minify(block.captured.program, spec, tmp_path / "out", inputs=tmp_path / "c" / "inputs.pt")

    assert result.status is JobState.succeeded, result.reason
    code = result.report.graph_code or ""
    assert "relu" in ops_of(code) and "cos" not in ops_of(code) and "sin" not in ops_of(code)
