"""A compile error only a compile for training has (issue 38: pytorch#185715, AOT autograd failing
while it traces the joint graph's backward) is captured with `failure.training`, compiled for
training by the worker (grad mode on, floating-point inputs requiring grad) and by repro.py, and so
minimized like any compile error. Before, the capture refused it: the worker compiled the captured
forward graph for inference, where no backward is traced, and it passed.

The family: custom ops whose derivative raises when AOT autograd traces it
(tests/support/backward_ops.py, two exception types), between other ops, and torch's own pow with
an exponent that is a symbolic int (pytorch#185715's "NYI SymInt equality"), all on `aot_eager`
(AOT autograd, no code generation). A graph with a custom autograd.Function is captured as
program.json instead, its backward kept (tests/client/capture/test_fidelity_training.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from minify_client.capture import capture_failures
from minify_contract.models import JobSpec, JobState
from minify_worker.engine import minify
from minify_worker.programs.fx.op_modules import ALLOWED_OP_MODULES_ENV
from tests.support import backward_ops
from tests.support.repro import run_repro

OPS = "tests.support.backward_ops"


def _sin_chain(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(backward_ops.sin_with_broken_grad(torch.cos(x)) * 2) + 1


def _exp_chain(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(backward_ops.exp_with_broken_grad(x.abs())).sum()


# Each: the program, what the minimal graph calls, what must be gone, and the signature.
FAMILY: dict[str, tuple[Callable[[torch.Tensor], Any], str, str, str]] = {
    "RuntimeError": (_sin_chain, "sin_with_broken_grad", "relu",
                     "RuntimeError: injected failure in the backward of sin_with_broken_grad"),
    "ValueError": (_exp_chain, "exp_with_broken_grad", "tanh",
                   "ValueError: injected failure in the backward of exp_with_broken_grad"),
}


def _capture(tmp_path: Path, program: Callable[..., Any], *args: Any, **compile_options: Any) -> JobSpec:
    """`program` compiled and called on `args` under `capture_failures`: it must raise, and be
    captured into `tmp_path`; the capture's spec."""
    torch._dynamo.reset()
    with pytest.raises(Exception), capture_failures(  # noqa: B017 - the failure is whatever torch raises
            torch.nn.Identity(), args, save_to=tmp_path, name="program") as block:
        torch.compile(program, **compile_options)(*args)
    assert block.captured is not None, block.capture_error
    return JobSpec.model_validate_json((tmp_path / "spec.json").read_text())


def _fixed_in_this_torch(program: Callable[..., Any], *args: Any, **compile_options: Any) -> bool:
    """Whether `program` compiles and runs on `args` (the bug it stands for is fixed in this torch)."""
    torch._dynamo.reset()
    try:
        torch.compile(program, **compile_options)(*args)
    except Exception:  # the bug: whatever torch raises
        return False
    finally:
        torch._dynamo.reset()
    return True


def _minify(tmp_path: Path, spec: JobSpec) -> Any:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ALLOWED_OP_MODULES_ENV, "tests.support")
        return minify(tmp_path / "program.pt2", spec.model_copy(update={"culprit": False, "versions": False}),
                      tmp_path / "out", inputs=tmp_path / "inputs.pt")


@pytest.mark.parametrize("error", list(FAMILY))
def test_a_compile_error_in_the_backward_is_captured_for_training_and_minimized(tmp_path: Path, error: str) -> None:
    program, kept, gone, signature = FAMILY[error]
    spec = _capture(tmp_path, program, torch.randn(4, 3, requires_grad=True), backend="aot_eager")
    assert (spec.failure.kind, spec.failure.training, spec.failure.signature) == ("compile_error", True, signature)
    assert spec.op_modules == [OPS]

    done = _minify(tmp_path, spec)

    assert done.status is JobState.succeeded, done.reason
    assert done.report.signature == signature
    assert kept in (done.report.graph_code or "") and gone not in (done.report.graph_code or "")
    ran = run_repro(tmp_path / "out" / "repro.py", **{ALLOWED_OP_MODULES_ENV: "tests.support"})
    assert ran.returncode != 0 and f"repro failed with: {signature}" in ran.stderr, ran.stderr[-2000:]


def test_the_same_program_compiled_for_inference_passes(tmp_path: Path) -> None:
    """Why the spec says training: without it the worker's compile traces no backward."""
    spec = _capture(tmp_path, _sin_chain, torch.randn(4, 3, requires_grad=True), backend="aot_eager")
    inference = spec.model_copy(update={"failure": spec.failure.model_copy(update={"training": False})})

    done = _minify(tmp_path, inference)

    assert done.status is JobState.not_reproducible, done.reason


def power(x: torch.Tensor, exponent: int) -> torch.Tensor:
    return torch.pow(x, exponent) * 3


def test_pow_with_a_symbolic_int_exponent_fails_in_aots_backward_and_is_minimized(tmp_path: Path) -> None:
    """pytorch#185715 (torch 2.11-2.13; fixed in 2.15): the gradient of pow by a symbolic int exponent of 0."""
    if _fixed_in_this_torch(power, torch.full((1, 3), 2.0, requires_grad=True), 0, backend="aot_eager", dynamic=True):
        pytest.skip(f"pytorch#185715 is fixed in torch {torch.__version__}: the program compiles")
    spec = _capture(tmp_path, power, torch.full((1, 3), 2.0, requires_grad=True), 0, backend="aot_eager",
                    dynamic=True)
    assert spec.failure.training and "NYI SymInt equality" in (spec.failure.signature or "")

    done = _minify(tmp_path, spec)

    assert done.status is JobState.succeeded, done.reason
    assert "pow" in (done.report.graph_code or "") and "mul" not in (done.report.graph_code or "")
    ran = run_repro(tmp_path / "out" / "repro.py")
    assert ran.returncode != 0 and "NYI SymInt equality" in ran.stderr, ran.stderr[-2000:]
