"""A program's constant tensors reach the worker's compiler as constants (issue 38, pytorch#175966).

A tensor a program builds from literals (`torch.tensor([10**9])`, `torch.as_tensor([...])`) is a
constant in the graph torch.compile hands a compiler (AOT autograd's `_tensor_constant0`), which
inductor folds into its kernels; torch.export lifts it to an input (`c_lifted_tensor_0`). Compiled
as an input, the captured program was another program: #175966's 32-bit product, which needs the
constant folded in, passed 3x in the worker. The worker and repro.py now compile such inputs as
tensor attributes of the module (`backends.constants_as_attributes`).

The family: programs that build a constant from literals in four ways (an int64 factor, a 0-d
float, a list through `as_tensor`, a float vector in a `where`), each captured from a real
`torch.compile` with MINIFY_CAPTURE_ACCURACY's check, minimized by the offline engine and its
repro.py run in a fresh process. The backend is cheap and behaves as inductor did: AOT autograd,
then a forward compiler that gets the values wrong when a constant tensor is folded into the
graph (a get_attr), and right when the same tensor is an input (tests/support/fidelity_backends.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from minify_client.capture import capture_failures
from minify_contract.models import JobSpec, JobState
from minify_worker.engine import MinifyResult, minify
from minify_worker.programs.fx.backends import ALLOWED_BACKENDS_ENV
from tests.support.repro import Repros

# The backend (`wrong_with_a_constant`) by the name a capture records and sandbox children and repro.py
# import: a module of torch alone, which each repro.py imports again.
BACKENDS = "tests.support.fidelity_backends"


def int64_factor(x: torch.Tensor) -> torch.Tensor:
    return torch.arange(0, 11, dtype=torch.int64) * torch.tensor([10**9], dtype=torch.int64) + x


def scalar_scale(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x) * torch.tensor(3.0)


def listed_offsets(x: torch.Tensor) -> torch.Tensor:
    return x.sum(0) + torch.as_tensor([1, 2, 3, 4])


def default_vector(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x > 0, x, torch.tensor([-1.0, -2.0, -3.0, -4.0]))


FAMILY = {
    "int64_factor": (int64_factor, lambda: torch.zeros(1, dtype=torch.int64)),
    "scalar_scale": (scalar_scale, lambda: torch.randn(4, 4)),
    "listed_offsets": (listed_offsets, lambda: torch.arange(16).reshape(4, 4)),
    "default_vector": (default_vector, lambda: torch.randn(3, 4)),
}

# Wrong floats, and wrong integers alone, are told apart (`minify_worker.outcomes.INTEGER_ONLY`).
SIGNATURES = {"int64_factor": "AccuracyError: integer outputs only", "scalar_scale": "AccuracyError",
              "listed_offsets": "AccuracyError: integer outputs only", "default_vector": "AccuracyError"}


def capture(function: Callable[..., Any], x: torch.Tensor, directory: Path) -> Path:
    """The user's compile of `function` with the backend imported as the worker imports it, its
    wrong values captured by the accuracy check (nothing raises); the captured program's path."""
    backend = importlib.import_module(BACKENDS).wrong_with_a_constant
    torch._dynamo.reset()
    with capture_failures(torch.nn.Identity(), (x,), save_to=directory, name="program", accuracy=True) as block:
        torch.compile(function, backend=backend)(x.clone())
    assert block.captured is not None, block.capture_error
    return directory / "program.pt2"


@pytest.fixture(scope="module")
def minimized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, MinifyResult]]:
    """Every program of the family captured and minimized (two candidates at a time, no culprit)."""
    results = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ALLOWED_BACKENDS_ENV, BACKENDS)
        for name, (function, make_input) in FAMILY.items():
            captured = capture(function, make_input(), tmp_path_factory.mktemp(name))
            spec = JobSpec.model_validate_json((captured.parent / "spec.json").read_text())
            spec = spec.model_copy(update={"limits": spec.limits.model_copy(update={"parallelism": 2}),
                                           "culprit": False, "versions": False, "shrink": False})
            results[name] = captured, minify(captured, spec, captured.parent / "out",
                                             inputs=captured.parent / "inputs.pt")
    return results


@pytest.fixture(scope="module")
def repros() -> Repros:
    """The module's repro.py runs, each as `python repro.py` in a fork of the test process's one
    interpreter that ran their first imports (tests/support/repro.py), instead of one interpreter
    importing torch per repro."""
    return Repros()


@pytest.mark.parametrize("name", FAMILY)
def test_the_capture_holds_a_constant_tensor_as_export_lifts_it(
        name: str, minimized: dict[str, tuple[Path, MinifyResult]]) -> None:
    program = torch.export.load(minimized[name][0])

    kinds = [spec.kind.name for spec in program.graph_signature.input_specs]
    assert "CONSTANT_TENSOR" in kinds, kinds  # the class under test: a lifted constant


@pytest.mark.parametrize("name", FAMILY)
def test_a_failure_that_needs_the_constant_folded_reproduces_in_the_worker(
        name: str, minimized: dict[str, tuple[Path, MinifyResult]]) -> None:
    result = minimized[name][1]

    assert result.status is JobState.succeeded, result.reason
    assert result.report.signature == SIGNATURES[name]
    code = result.report.graph_code or ""
    assert "lift_fresh_copy" in code or "c_lifted_tensor" in code, code


@pytest.mark.parametrize("name", FAMILY)
def test_its_repro_compiles_the_constant_as_a_constant_and_fails_the_same_way(
        name: str, minimized: dict[str, tuple[Path, MinifyResult]], repros: Repros) -> None:
    repro = minimized[name][1].artifacts["repro.py"]
    done = repros.run(repro)

    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert f"repro failed with: {SIGNATURES[name]}\n" in done.stderr
    assert "CONSTANT_INPUTS = [" in repro.read_text()


def test_a_program_with_the_constant_as_a_real_input_is_compiled_with_it_as_an_input(tmp_path: Path) -> None:
    """Only constants move: the same product with the factor passed in is not wrong, so nothing is
    captured (the backend sees no constant)."""
    def factor_given(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
        return torch.arange(0, 11, dtype=torch.int64) * factor + x

    backend = importlib.import_module(BACKENDS).wrong_with_a_constant
    torch._dynamo.reset()
    x, factor = torch.zeros(1, dtype=torch.int64), torch.tensor([10**9])
    with capture_failures(torch.nn.Identity(), (x, factor), save_to=tmp_path, accuracy=True) as block:
        result = torch.compile(factor_given, backend=backend)(x, factor)

    assert block.captured is None
    assert torch.equal(result, factor_given(x, factor))
