"""The repro of a program that writes into its inputs judges it on the inputs it was given (issue
38, pytorch#198101).

#198101's compiled program reads an input after a later in-place write to it: its values are
those of the mutated input. The worker judged it right (eager's reference on copies, then the
compiled program on copies), but the repro.py it wrote for small inputs ran the compiled program
on `inputs` themselves and only then computed eager's reference, from the inputs the program had
just written into: the reference read the mutated input too, agreed with the wrong values, and
the repro passed. The compiled program now runs on copies there as well.

The family: three programs that read an input and then write into it (`add_`, a slice assignment
through an int32 view, `mul_` after a reduction), each captured from a real `torch.compile` with
the accuracy check, minimized by the offline engine and its repro.py run in a fresh process. The
backend is cheap and wrong as #198101's kernels were: eager, but what it returns is computed
from the inputs after the program's writes into them (tests/support/fidelity_backends.py).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

from minify_client.capture import capture_failures
from minify_contract.models import JobSpec, JobState
from minify_worker.engine import MinifyResult, minify
from minify_worker.programs.fx.backends import ALLOWED_BACKENDS_ENV
from tests.support.repro import Repros

# The backend (`reads_after_writes`) by the name a capture records and sandbox children and repro.py
# import: a module of torch alone, which each repro.py imports again.
BACKENDS = "tests.support.fidelity_backends"
# Per program: its input as the user gave it, the capture's directory, the job.
Minimized = dict[str, tuple[torch.Tensor, Path, MinifyResult]]


def doubled_then_bumped(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    x.add_(1)
    return y


def int32_view_then_overwritten(x: torch.Tensor) -> torch.Tensor:
    y = x.view(torch.int32) * 2
    x[:, 1:3] = 2
    return y.view(torch.int64)


def summed_then_scaled(x: torch.Tensor) -> torch.Tensor:
    y = x.sum(0)
    x.mul_(3)
    return y


FAMILY = {
    "add_": (doubled_then_bumped, lambda: torch.arange(12.0).reshape(3, 4)),
    "setitem": (int32_view_then_overwritten, lambda: torch.arange(-6, 6, dtype=torch.int64).reshape(3, 4)),
    "mul_": (summed_then_scaled, lambda: torch.arange(8, dtype=torch.int64).reshape(2, 4)),
}

# Wrong floats, and wrong integers alone, are told apart (`minify_worker.outcomes.INTEGER_ONLY`).
SIGNATURES = {"add_": "AccuracyError", "setitem": "AccuracyError: integer outputs only",
              "mul_": "AccuracyError: integer outputs only"}


@pytest.fixture(scope="module")
def minimized(tmp_path_factory: pytest.TempPathFactory) -> Minimized:
    """Every program of the family captured (its input as the user passed it) and minimized."""
    backend = importlib.import_module(BACKENDS).reads_after_writes
    results = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ALLOWED_BACKENDS_ENV, BACKENDS)
        for name, (function, make_input) in FAMILY.items():
            directory = tmp_path_factory.mktemp(name.strip("_"))
            torch._dynamo.reset()
            x = make_input()
            given = x.clone()
            with capture_failures(torch.nn.Identity(), (x,), save_to=directory, name="program",
                                  accuracy=True) as block:
                torch.compile(function, backend=backend)(x)
            assert block.captured is not None, block.capture_error
            spec = JobSpec.model_validate_json((directory / "spec.json").read_text())
            spec = spec.model_copy(update={"limits": spec.limits.model_copy(update={"parallelism": 2}),
                                           "culprit": False, "versions": False, "shrink": False})
            results[name] = given, directory, minify(directory / "program.pt2", spec, directory / "out",
                                                     inputs=directory / "inputs.pt")
    return results


@pytest.fixture(scope="module")
def repros() -> Repros:
    """The module's repro.py runs, each as `python repro.py` in a fork of the test process's one
    interpreter that ran their first imports (tests/support/repro.py), instead of one interpreter
    importing torch per repro."""
    return Repros()


@pytest.mark.parametrize("name", FAMILY)
def test_the_capture_keeps_the_input_as_given_before_the_program_wrote_into_it(
        name: str, minimized: Minimized) -> None:
    given, directory, _ = minimized[name]
    args, _ = torch.load(directory / "inputs.pt", weights_only=True)

    assert torch.equal(args[0], given)


@pytest.mark.parametrize("name", FAMILY)
def test_the_wrong_values_are_minimized(name: str, minimized: Minimized) -> None:
    result = minimized[name][2]

    assert result.status is JobState.succeeded, result.reason
    assert result.report.signature == SIGNATURES[name]


@pytest.mark.parametrize("name", FAMILY)
def test_its_repro_judges_the_program_on_the_inputs_it_was_given_and_fails(
        name: str, minimized: Minimized, repros: Repros) -> None:
    repro = minimized[name][2].artifacts["repro.py"]
    done = repros.run(repro)

    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert f"repro failed with: {SIGNATURES[name]}\n" in done.stderr
