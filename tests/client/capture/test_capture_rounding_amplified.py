"""A failure no graph holds, made of differences within the tolerance (issue 38, pytorch#148859's
class): dynamo breaks the program, the compiled graphs' outputs pass the accuracy check though not
bit for bit, and eager code after the break that counts or compares exact values (`unique`,
`nonzero`, `==`) turns those last bits into another result. Nothing is captured (no graph is wrong
by torch's rule); the script runner says what happened and what to try, where the check saw such
differences and dynamo broke the program. The backend computes in float64 and casts back: last-bit
differences, no compiler.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import fx

from minify_client.capture import capture_failures, diagnose, torch_hooks
from tests.support.backends import in_fp64

REPO = Path(__file__).resolve().parents[3]
MODULE = "tests.client.capture.test_capture_rounding_amplified"


def as_is(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    return gm.forward


def wave(x: torch.Tensor) -> torch.Tensor:
    return (x * 7.3).sin() * 5 + x.exp()


def counted_after_break(kind: str) -> Callable[[torch.Tensor], torch.Tensor]:
    def program(x: torch.Tensor) -> torch.Tensor:
        y = wave(x)
        torch._dynamo.graph_break()
        if kind == "unique":
            return torch.unique(y).float()
        return torch.nonzero(y > y.median()).float()

    return program


@pytest.fixture
def inexact(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_hooks, "_INEXACT", [])


@pytest.mark.parametrize("kind", ["unique", "nonzero"])
def test_graphs_passed_within_the_tolerance_are_recorded_with_the_break(kind: str, tmp_path: Path,
                                                                        inexact: None) -> None:
    x = torch.linspace(-1, 1, 4096)
    torch._dynamo.reset()
    with capture_failures(counted_after_break(kind), (x,), save_to=tmp_path, accuracy=True) as captured:
        torch.compile(counted_after_break(kind), backend=in_fp64)(x)
    torch._dynamo.reset()

    assert captured.captured is None
    (said,) = torch_hooks.passed_inexact()
    assert said.startswith("output 0: ") and "float32 values differ from eager's by up to" in said
    note = diagnose.rounding_amplified(torch_hooks.passed_inexact(), ["graph_break()"])
    assert note is not None and said in note and "(graph_break())" in note and "none is captured" in note


def test_graphs_equal_to_eager_bit_for_bit_are_not_recorded(tmp_path: Path, inexact: None) -> None:
    x = torch.linspace(-1, 1, 64)
    torch._dynamo.reset()
    with capture_failures(counted_after_break("unique"), (x,), save_to=tmp_path, accuracy=True):
        torch.compile(counted_after_break("unique"), backend=as_is)(x)
    torch._dynamo.reset()

    assert torch_hooks.passed_inexact() == []
    assert diagnose.rounding_amplified([], ["graph_break()"]) is None


def test_without_a_graph_break_there_is_no_such_note() -> None:
    assert diagnose.rounding_amplified(["output 0: 1 of 4 float32 values differ"], []) is None


def test_the_script_runner_says_it_where_the_script_fails_with_nothing_captured(tmp_path: Path) -> None:
    script = tmp_path / "counts.py"
    script.write_text(textwrap.dedent(f"""
        import torch
        from {MODULE} import counted_after_break
        from tests.support.backends import in_fp64

        x = torch.linspace(-1, 1, 4096)
        program = counted_after_break("unique")
        assert torch.equal(torch.compile(program, backend=in_fp64)(x), program(x)), "compiled != eager"
    """))
    env = {**os.environ, "PYTHONPATH": str(REPO), "MINIFY_CAPTURE_ACCURACY": "1"}
    env.pop("MINIFY_CAPTURE_DIAGNOSE", None)
    done = subprocess.run([sys.executable, "-m", "minify_client.capture", "--dir", str(tmp_path / "c"), str(script)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    assert done.returncode == 1 and "AssertionError: compiled != eager" in done.stderr, done.stderr[-3000:]
    notes = [line for line in done.stderr.splitlines() if line.startswith("minify: the compiled graphs passed")]
    assert len(notes) == 1 and "not bit for bit" in notes[0], done.stderr[-3000:]
