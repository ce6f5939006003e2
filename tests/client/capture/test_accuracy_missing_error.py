"""A missing error is an accuracy failure of its own (issue 38): eager raises and the compiled graph
returns a result (a dtype or bounds check the compiler dropped). The accuracy capture
(`MINIFY_CAPTURE_ACCURACY=1`) captures it as `MissingError`, keyed by eager's error, and the worker
judges the same; a program that raises compiled too is the user's mistake and is never captured.

The family: matrix products of float16 by float32 (`mm`, `@`, `addmm`, `linear`; `bmm` and `dot` are refused by
dynamo's own fake-tensor check, so compiled raises too) through a
backend that casts their operands, and an out-of-range `index_select` through one that clamps the
indices (a dropped bounds check); one real inductor bug (pytorch#141865: `mm` of mixed dtypes on CPU).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from minify_client.capture import capture_failures
from minify_contract.models import JobSpec
from minify_worker.outcomes import Fails, Invalid
from minify_worker.programs.fx.backends import ALLOWED_BACKENDS_ENV
from tests.client.capture.test_accuracy_backends import (
    MODULE,
    clamp_indices_on_index_select,
    drop_dtype_check_on_mm,
    minimize_capture,
    save_copies,
)
from tests.support.captures import run_as_the_worker


@pytest.fixture
def allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALLOWED_BACKENDS_ENV, MODULE)


def half(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).half()


def single(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1))


FAMILY: list[tuple[str, Callable[..., Any], tuple[Any, ...], Any]] = [
    ("mm", lambda a, b: torch.mm(a, b) + 1, (half(2, 3), single(3, 2)), drop_dtype_check_on_mm),
    ("matmul", lambda a, b: torch.relu(a @ b), (half(2, 3), single(3, 2)), drop_dtype_check_on_mm),
    ("addmm", lambda a, b: torch.addmm(b[:, :2], a, b), (half(3, 3), single(3, 2)), drop_dtype_check_on_mm),
    ("linear", lambda a, b: torch.nn.functional.linear(a, b).sum(0), (half(2, 3), single(4, 3)),
     drop_dtype_check_on_mm),
    ("index_select", lambda x, i: torch.index_select(x, 0, i).cos(), (single(4, 2), torch.tensor([1, 7])),
     clamp_indices_on_index_select),
]


def capture(program: Callable[..., Any], args: tuple[Any, ...], backend: Any, directory: Path) -> tuple[Any, Any]:
    """What the compiled program returned (or raised) and the capture."""
    torch._dynamo.reset()
    outcome: Any = None
    with capture_failures(program, args, save_to=directory, accuracy=True, exceptions=()) as captured:
        try:
            outcome = torch.compile(program, backend=backend)(*args)
        except Exception as error:  # the program's own outcome, kept to compare
            outcome = error
    torch._dynamo.reset()
    return outcome, captured


@pytest.mark.parametrize(("name", "program", "args", "backend"), FAMILY, ids=[case[0] for case in FAMILY])
def test_a_dropped_check_is_captured_as_a_missing_error_and_the_worker_judges_it_the_same(
        name: str, program: Callable[..., Any], args: tuple[Any, ...], backend: Any, tmp_path: Path,
        allowed: None) -> None:
    with pytest.raises((RuntimeError, IndexError)) as eager:
        program(*args)

    result, captured = capture(program, args, backend, tmp_path)

    assert isinstance(result, torch.Tensor)  # the program's outcome is its own: the compiled result
    assert captured.captured is not None, "the missing error went unnoticed"
    spec = JobSpec.model_validate_json((tmp_path / "spec.json").read_text())
    assert spec.failure.kind == "accuracy"
    assert spec.failure.signature is not None and spec.failure.signature.startswith(
        f"MissingError: eager raises {type(eager.value).__name__}: ")
    outcome = run_as_the_worker(tmp_path)
    assert isinstance(outcome, Fails), outcome
    assert outcome.signature.exc_type == "MissingError"
    assert str(outcome.signature) == spec.failure.signature  # the same key: what eager raised


def test_missing_errors_of_different_checks_are_different_failures(tmp_path: Path, allowed: None) -> None:
    (_, mm, mm_args, mm_backend), (_, select, select_args, select_backend) = FAMILY[0], FAMILY[-1]
    capture(mm, mm_args, mm_backend, tmp_path / "mm")
    capture(select, select_args, select_backend, tmp_path / "select")

    first, second = run_as_the_worker(tmp_path / "mm"), run_as_the_worker(tmp_path / "select")

    assert isinstance(first, Fails) and isinstance(second, Fails)
    assert not first.signature.same_as(second.signature)  # a minimization never drifts from one to the other


def test_a_program_that_raises_compiled_too_is_never_captured(tmp_path: Path) -> None:
    """The user's mistake: eager raises and so does the compiled graph (backend "eager")."""
    program, args = FAMILY[0][1], FAMILY[0][2]

    result, captured = capture(program, args, "eager", tmp_path)

    assert isinstance(result, RuntimeError) and "dtype" in str(result)  # raised as it was
    assert captured.captured is None and not list(tmp_path.glob("*.pt2"))


def test_a_candidate_that_raises_compiled_too_is_invalid(tmp_path: Path, allowed: None) -> None:
    program, args, backend = FAMILY[0][1], FAMILY[0][2], FAMILY[0][3]
    capture(program, args, backend, tmp_path)
    spec = JobSpec.model_validate_json((tmp_path / "spec.json").read_text())
    (tmp_path / "spec.json").write_text(spec.model_copy(update={"backend": "eager"}).model_dump_json())

    outcome = run_as_the_worker(tmp_path)

    assert isinstance(outcome, Invalid) and "and so does the compiled program" in outcome.message, outcome


def test_a_missing_error_is_minimized_and_its_repro_says_so(tmp_path: Path, allowed: None) -> None:
    def program(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.cos(torch.mm(a, b)).sum() + torch.sin(b).sum()

    capture(program, (half(2, 3), single(3, 2)), drop_dtype_check_on_mm, tmp_path / "capture")
    spec, ran = minimize_capture(tmp_path / "capture", tmp_path / "out", ["mm"])
    assert f"repro failed with: {spec.failure.signature}" in ran.stderr, ran.stderr[-3000:]


SAVED = [("mm", lambda x, w: x @ w), ("mul", lambda x, w: (x * w[:2]).sin()),
         ("conv1d", lambda x, w: torch.nn.functional.conv1d(x.unsqueeze(0), w.unsqueeze(0)[:, :2]))]


@pytest.mark.parametrize(("name", "program"), SAVED, ids=[case[0] for case in SAVED])
def test_an_input_modified_before_backward_is_said_where_eager_raises(
        name: str, program: Callable[..., Any], caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    """pytorch#197887's class: no graph holds the in-place modification, so nothing is captured; a
    warning names the input and eager's error. The program's own outcome is what it was."""
    def step(compiled: Callable[..., Any]) -> torch.Tensor:
        x, w = torch.arange(6.0).reshape(2, 3) / 7, (torch.arange(9.0).reshape(3, 3) / 5).requires_grad_()
        out = compiled(x, w)
        x.add_(1)
        out.sum().backward()
        return w.grad

    with pytest.raises(RuntimeError, match="inplace operation"):
        step(program)
    torch._dynamo.reset()
    with caplog.at_level("WARNING"), capture_failures(program, (), save_to=tmp_path, accuracy=True) as captured:
        grad = step(torch.compile(program, backend=save_copies))
    torch._dynamo.reset()

    assert isinstance(grad, torch.Tensor)  # the compiled program's outcome, unchanged: no error
    assert captured.captured is None
    said = [record.getMessage() for record in caplog.records if "modified in place" in record.getMessage()]
    assert len(said) == 1 and said[0].startswith("minify: input ") and "(float32 (2, 3)) of a compiled training " \
        "graph was modified in place" in said[0], said
    assert "inplace operation" in said[0]


def test_an_input_modified_before_backward_where_eager_does_not_mind_is_not_said(
        caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    def program(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x + w  # add saves nothing: eager's backward does not mind a modified x

    x, w = torch.ones(3), torch.ones(3, requires_grad=True)
    torch._dynamo.reset()
    with caplog.at_level("WARNING"), capture_failures(program, (), save_to=tmp_path, accuracy=True):
        out = torch.compile(program, backend=save_copies)(x, w)
        x.add_(1)
        out.sum().backward()
    torch._dynamo.reset()
    assert not [record for record in caplog.records if "modified in place" in record.getMessage()]


@pytest.mark.inductor
def test_inductor_accepting_mixed_dtypes_in_mm_is_captured_and_reproduced(tmp_path: Path) -> None:
    """pytorch#141865's family on inductor: a 1x1 `mm` of float16 by float32 returns a result."""

    def program(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.mm(a, b)

    result, captured = capture(program, (half(1, 1), single(1, 1)), "inductor", tmp_path)

    assert isinstance(result, torch.Tensor) and captured.captured is not None
    outcome = run_as_the_worker(tmp_path)
    assert isinstance(outcome, Fails) and outcome.signature.exc_type == "MissingError", outcome
