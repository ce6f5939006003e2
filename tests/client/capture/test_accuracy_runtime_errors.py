"""A compiled graph whose run raises is captured (issue 38, pytorch#146536): the capture reported
only failing compiles and the accuracy check's mismatches, so an exception raised by the compiled
code's run (inductor's own size/stride assertion on a custom op's output, a kernel's check) left no
capture. Now the graph dynamo handed the backend is captured as `runtime_error` with the inputs of
the failing run, once per compiled graph, unless eager raises on them too (the user's mistake); the
program raises what it raised.

The family: a backend whose compiled code raises when run, on an elementwise op, a scan and an
indexing op, through `capture_failures` and the script runner; one real inductor bug (a custom op
whose fake kernel says contiguous where the real one returns a transposed tensor).
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

from minify_client.capture import capture_failures
from minify_contract.models import JobSpec
from minify_worker.outcomes import Fails
from minify_worker.programs.fx.backends import ALLOWED_BACKENDS_ENV
from tests.client.capture.test_accuracy_backends import (
    MODULE,
    raise_at_run_on_cumsum,
    raise_at_run_on_index_select,
    raise_at_run_on_relu,
)
from tests.support.captures import run_as_the_worker

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALLOWED_BACKENDS_ENV, MODULE)


FAMILY: list[tuple[str, Callable[..., Any], Any]] = [
    ("relu", lambda x: torch.relu(x) * 2, raise_at_run_on_relu),
    ("cumsum", lambda x: torch.cumsum(x, 0).sin(), raise_at_run_on_cumsum),
    ("index_select", lambda x: torch.index_select(x, 0, torch.tensor([2, 0])) + 1, raise_at_run_on_index_select),
]


@pytest.mark.parametrize(("name", "program", "backend"), FAMILY, ids=[case[0] for case in FAMILY])
def test_a_run_that_raises_is_captured_and_the_worker_reproduces_it(
        name: str, program: Callable[..., Any], backend: Any, tmp_path: Path, allowed: None) -> None:
    x = torch.randn(3, 4)
    torch._dynamo.reset()
    with pytest.raises(AssertionError, match="injected") as raised:
        with capture_failures(program, (x,), save_to=tmp_path) as captured:
            torch.compile(program, backend=backend)(x)
    torch._dynamo.reset()

    assert "injected" in str(raised.value)  # the program's own error, re-raised as it was
    spec = JobSpec.model_validate_json((tmp_path / "spec.json").read_text())
    assert captured.captured is not None and spec.failure.kind == "runtime_error"
    assert spec.failure.signature == "AssertionError: expected size N==N, stride N==N at dim=N (injected)"
    outcome = run_as_the_worker(tmp_path)
    assert isinstance(outcome, Fails) and outcome.signature.kind == "runtime_error", outcome
    assert str(outcome.signature) == spec.failure.signature


def test_a_run_that_raises_eagerly_too_is_never_captured(tmp_path: Path) -> None:
    """The user's mistake: an index out of range raises compiled (backend "eager") and eagerly."""

    def program(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return torch.index_select(x, 0, index) + 1

    torch._dynamo.reset()
    with pytest.raises(IndexError), capture_failures(program, (torch.randn(3), torch.tensor([5])),
                                                     save_to=tmp_path, exceptions=()) as captured:
        torch.compile(program, backend="eager")(torch.randn(3), torch.tensor([5]))
    torch._dynamo.reset()
    assert captured.captured is None and not list(tmp_path.glob("*.pt2"))


def test_the_script_runner_captures_a_run_that_raises(tmp_path: Path, allowed: None,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Through `python -m minify_client.capture`, with a custom op the script itself registers: the
    spec names the script's module (not `__main__`, which the runner is again once the script ended)."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import torch
        from {MODULE} import raise_at_run_on_cumsum


        @torch.library.custom_op("accuracy_runtime_script::twice", mutates_args=())
        def twice(x: torch.Tensor) -> torch.Tensor:
            return x * 2


        @twice.register_fake
        def _(x):
            return torch.empty_like(x)


        if __name__ == "__main__":
            torch.compile(lambda x: torch.cumsum(twice(x), 0) * 3, backend=raise_at_run_on_cumsum)(torch.randn(5))
    """))
    ran = subprocess.run([sys.executable, "-m", "minify_client.capture", "--dir", str(tmp_path / "captures"),
                          str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})

    assert ran.returncode == 1 and "AssertionError: expected size" in ran.stderr, ran.stderr[-3000:]
    assert "minify: captured the failing dynamo graph" in ran.stderr, ran.stderr[-3000:]
    (directory,) = [path for path in (tmp_path / "captures").iterdir() if path.is_dir()]
    spec = JobSpec.model_validate_json((directory / "spec.json").read_text())
    assert spec.op_modules == ["train"] and spec.failure.kind == "runtime_error"
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__("train")  # the op registered here, as the worker's op_modules import does
    outcome = run_as_the_worker(directory)
    assert isinstance(outcome, Fails) and outcome.signature.exc_type == "AssertionError", outcome


@pytest.mark.inductor
def test_inductors_stride_assertion_on_a_custom_ops_output_is_captured_and_reproduced(tmp_path: Path) -> None:
    """The class of pytorch#146536 without vmap: a custom op whose fake kernel says contiguous and
    whose real kernel returns a transposed tensor trips inductor's `assert_size_stride` at run."""
    @torch.library.custom_op("accuracy_runtime_test::transposed", mutates_args=())
    def transposed(x: torch.Tensor) -> torch.Tensor:
        return x.t().contiguous().t()

    @transposed.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    def program(x: torch.Tensor) -> torch.Tensor:
        return transposed(x.sin()).cos()

    x = torch.randn(3, 2)
    torch._dynamo.reset()
    with pytest.raises(AssertionError, match="stride"), capture_failures(program, (x,), save_to=tmp_path) as captured:
        torch.compile(program)(x)
    torch._dynamo.reset()

    assert captured.captured is not None
    spec = JobSpec.model_validate_json((tmp_path / "spec.json").read_text())
    assert spec.failure.kind == "runtime_error" and (spec.failure.signature or "").startswith("AssertionError")
    outcome = run_as_the_worker(tmp_path)
    assert isinstance(outcome, Fails) and str(outcome.signature) == spec.failure.signature, outcome
