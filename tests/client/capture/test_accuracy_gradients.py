"""Wrong gradients are accuracy failures (issue 38): a training step whose compiled gradients differ
from eager's, its forward outputs right, is captured as `GradientError` by the accuracy capture
(`MINIFY_CAPTURE_ACCURACY=1`, `capture_failures(accuracy=True)`), and the worker judges the same:
the program compiled for training, the gradients of the sum of its outputs against eager's with an
fp64 reference. The family: an elementwise op, a reduction with ties, a matmul and a softmax, each
with a backend whose forward is right and whose gradient through that op is doubled; one real
inductor bug (pytorch#186799: the gradient of `atan2(x, y).amin(1)` with ties).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import fx

from minify_client.capture import capture_failures
from minify_contract.models import JobSpec
from minify_worker.outcomes import Fails, Passes
from minify_worker.programs.fx.backends import ALLOWED_BACKENDS_ENV
from tests.client.capture.test_accuracy_backends import (
    MODULE,
    minimize_capture,
    wrong_grad_on_amin,
    wrong_grad_on_matmul,
    wrong_grad_on_sin,
    wrong_grad_on_softmax,
)
from tests.support.captures import run_as_the_worker


@pytest.fixture
def allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALLOWED_BACKENDS_ENV, MODULE)


def sin_step(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (torch.sin(x) * w).sum()


def amin_step(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x * w).amin(dim=1).sum()


def matmul_step(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w).mean()


def softmax_step(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (torch.softmax(x * w, dim=-1) * torch.arange(3.0)).sum()


FAMILY = [(sin_step, wrong_grad_on_sin), (amin_step, wrong_grad_on_amin), (matmul_step, wrong_grad_on_matmul),
          (softmax_step, wrong_grad_on_softmax)]


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return (torch.randn(3, 3, generator=generator, requires_grad=True),
            torch.randn(3, 3, generator=generator, requires_grad=True))


def captured_step(step: Callable[..., Any], backend: Any, directory: Path, x: Any, w: Any) -> capture_failures:
    torch._dynamo.reset()
    with capture_failures(step, (x, w), save_to=directory, accuracy=True) as captured:
        torch.compile(step, backend=backend)(x, w).backward()
    torch._dynamo.reset()
    return captured


@pytest.mark.parametrize(("step", "backend"), FAMILY, ids=[step.__name__ for step, _ in FAMILY])
def test_wrong_gradients_are_captured_and_the_worker_judges_them_the_same(
        step: Callable[..., Any], backend: Any, tmp_path: Path, allowed: None) -> None:
    x, w = inputs()
    eager = torch.autograd.grad(step(x, w), (x, w))

    captured = captured_step(step, backend, tmp_path, x, w)

    assert not torch.allclose(x.grad, eager[0]) or not torch.allclose(w.grad, eager[1])  # the program's own result
    assert captured.captured is not None, "the wrong gradients went unnoticed"
    spec = JobSpec.model_validate_json((tmp_path / "spec.json").read_text())
    assert (spec.failure.kind, spec.failure.signature) == ("accuracy", "GradientError")
    assert spec.backend == f"{MODULE}:{_name_of(backend)}"
    outcome = run_as_the_worker(tmp_path)
    assert isinstance(outcome, Fails), outcome
    assert (outcome.signature.exc_type, outcome.signature.key) == ("GradientError", "")
    assert "differs from eager's" in outcome.signature.text


def _name_of(backend: Any) -> str:
    import tests.client.capture.test_accuracy_backends as module

    return next(name for name, value in vars(module).items() if value is backend)


def test_an_inference_compile_is_not_judged_on_gradients(tmp_path: Path) -> None:
    x, w = (value.detach() for value in inputs())
    torch._dynamo.reset()
    with capture_failures(sin_step, (x, w), save_to=tmp_path, accuracy=True) as captured:
        torch.compile(sin_step, backend=wrong_grad_on_sin)(x, w)
    torch._dynamo.reset()
    assert captured.captured is None  # nothing requires grad: no gradient the program computes


def test_wrong_forward_outputs_stay_accuracy_errors_in_a_gradient_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A candidate whose outputs are wrong is an AccuracyError, not the job's GradientError: a
    minimization of a gradient bug never drifts into a forward one."""
    from minify_worker.programs.fx.graph import flat_graph_from_exported_program, graph_to_wire
    from minify_worker.programs.fx.prepare import concrete_values, placeholder_values
    from minify_worker.programs.fx.run import run_wire_candidate

    def step(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (torch.sin(torch.relu(x)) * w).sum()

    monkeypatch.setenv(ALLOWED_BACKENDS_ENV, f"{MODULE},tests.support.backends")
    x, w = (value.detach() for value in inputs())
    program = torch.export.export(fx.symbolic_trace(step), (x, w))
    graph = flat_graph_from_exported_program(program)
    values = placeholder_values(program, graph, [x, w])
    values.update(concrete_values(graph, values, "cpu"))

    def judged(backend: str) -> Any:
        failure = {"kind": "accuracy", "signature": "GradientError"}
        spec = JobSpec.model_validate({"backend": backend, "failure": failure})
        return run_wire_candidate(graph_to_wire(graph), values, spec, tmp_path)

    assert isinstance(judged(f"{MODULE}:wrong_grad_on_amin"), Passes)  # no amin: right
    grad = judged(f"{MODULE}:wrong_grad_on_sin")
    assert isinstance(grad, Fails) and grad.signature.exc_type == "GradientError", grad
    forward = judged("tests.support.backends:wrong_on_relu")
    assert isinstance(forward, Fails) and forward.signature.exc_type == "AccuracyError", forward


def test_a_gradient_bug_is_minimized_and_its_repro_checks_the_gradients(tmp_path: Path, allowed: None) -> None:
    def step(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (torch.sin(torch.relu(x) * 2) * w + torch.cos(w)).sum()

    x, w = inputs()
    captured = captured_step(step, wrong_grad_on_sin, tmp_path / "capture", x, w)
    assert captured.captured is not None
    _, ran = minimize_capture(tmp_path / "capture", tmp_path / "out", ["sin"])

    assert "repro failed with: GradientError" in ran.stderr and "minify expected:   GradientError" in ran.stderr, \
        ran.stderr[-3000:]


@pytest.mark.inductor
def test_inductor_wrong_gradients_of_a_reduction_with_ties_are_captured_and_reproduced(tmp_path: Path) -> None:
    """pytorch#186799 as a capture: the forward is right, inductor's gradient of amin's ties is not."""

    def smallest_angle(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.atan2(x, y).amin(dim=1).sum()

    x = torch.tensor([[1.0, 1.0, 2.0], [0.5, -1.0, -1.0]], requires_grad=True)
    y = torch.ones(2, 3, requires_grad=True)
    captured = captured_step(smallest_angle, "inductor", tmp_path, x, y)

    assert captured.captured is not None
    spec = JobSpec.model_validate_json((tmp_path / "spec.json").read_text())
    assert (spec.backend, spec.failure.signature) == ("inductor", "GradientError")
    outcome = run_as_the_worker(tmp_path)
    assert isinstance(outcome, Fails) and outcome.signature.exc_type == "GradientError", outcome


def test_the_check_leaves_the_programs_random_numbers_as_they_were(tmp_path: Path) -> None:
    def step(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(torch.sin(x), 0.5).sum()

    def drawn_after(capturing: bool) -> tuple[torch.Tensor, torch.Tensor]:
        torch._dynamo.reset()
        torch.manual_seed(0)
        x = torch.randn(8, requires_grad=True)
        compiled = torch.compile(step, backend="aot_eager")
        if capturing:
            with capture_failures(step, (x,), save_to=tmp_path, accuracy=True):
                loss = compiled(x)
        else:
            loss = compiled(x)
        loss.backward()
        return x.grad, torch.rand(4)

    assert all(torch.equal(a, b) for a, b in zip(drawn_after(True), drawn_after(False), strict=True))
