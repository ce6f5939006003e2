"""The seed's CPU scenarios (torch's test/inductor/test_minifier.py) through the real engine and real inductor.

Inductor's `cpp.inject_relu_bug_TESTING_ONLY` makes relu fail to compile, fail at run time or
compute wrong values; `cpp.inject_log1p_bug_TESTING_ONLY` does the same to log1p. A compile costs
seconds here, so these are the only engine tests that compile for real.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from examples import programs
from minify_contract.models import JobSpec, JobState
from minify_worker.engine import MinifyResult, minify
from minify_worker.programs.fx import culprit
from tests.support.backends import PREFIX
from tests.support.graphs import AOTI_RELU_CODE, ops_of

pytestmark = pytest.mark.inductor


def run(tmp_path: Path, builder: str, *, backend: str = "inductor", kind: str = "any",
        strict_accuracy: bool = False, phases: bool = False, **config: str) -> MinifyResult:
    """The engine on `builder`'s program; the phases after minimality (shrink, culprit: tested in
    their own modules, each a few compiles more) only with `phases`."""
    ep, _ = programs.BUILDERS[builder]()
    tmp_path.mkdir(parents=True, exist_ok=True)
    program = tmp_path / f"{builder}.pt2"
    torch.export.save(ep, program)
    spec = JobSpec.model_validate({
        "backend": backend,
        "failure": {"kind": kind, "strict_accuracy": strict_accuracy},
        "config": config,
        "shrink": phases,
        "culprit": phases,
    })
    return minify(program, spec, tmp_path / "out")


@pytest.mark.parametrize(
    ("bug", "kind", "exception"),
    [
        ("compile_error", "compile_error", "CppCompileError"),
        ("runtime_error", "runtime_error", None),
        ("accuracy", "accuracy", "AccuracyError"),
    ],
)
def test_relu_bug_after_aot_leaves_only_relu(tmp_path: Path, bug: str, kind: str, exception: str | None) -> None:
    result = run(tmp_path, "relu_cos", kind=kind, **{"cpp.inject_relu_bug_TESTING_ONLY": bug})

    assert result.status is JobState.succeeded, result.reason
    assert ops_of(result.report.graph_code) == ["relu"]
    assert result.report.failure_kind == kind
    if exception is not None:
        assert (result.report.signature or "").startswith(exception)


def test_accuracy_minifies_to_relu_but_strict_accuracy_to_log1p(tmp_path: Path) -> None:
    bugs = {"cpp.inject_relu_bug_TESTING_ONLY": "accuracy", "cpp.inject_log1p_bug_TESTING_ONLY": "accuracy"}

    loose = run(tmp_path / "loose", "accuracy_vs_strict", kind="accuracy", **bugs)
    strict = run(tmp_path / "strict", "accuracy_vs_strict", kind="accuracy", strict_accuracy=True, **bugs)

    assert loose.status is JobState.succeeded and strict.status is JobState.succeeded
    assert ops_of(loose.report.graph_code) == ["relu"]
    assert ops_of(strict.report.graph_code) == ["log1p"]


def test_aoti_compile_error_minifies_to_relu_of_a_linear_input(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """aot_inductor's one real minimization, end to end (shrink and culprit too): the seed's
    linear_relu_sigmoid with inductor's injected relu compile error. Its dict-input form's claim
    (the reduction keeps the pytree in and out specs) is the next test's, with a cheap backend.
    The culprit phase gets a second as its budget: its 20% of this job (a minute or more of AOTI
    compiles, ~13 CPU-s of g++ each) outgrows the suite's floor (tests/conftest.py), and at the
    floor's few seconds the phase, whose bisection they cut short too, spent them on AOTI compiles
    two at a time. It runs all the same: its first probes start, and it says the budget ran out."""
    monkeypatch.setenv(culprit.BUDGET_ENV, "1")
    result = run(tmp_path, "linear_relu_sigmoid", backend="aot_inductor", kind="compile_error", phases=True,
                 **{"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"})

    assert result.status is JobState.succeeded, result.reason
    module = torch.export.load(result.artifacts["minimized.pt2"]).module(check_guards=False)
    assert str(module.code).strip() == AOTI_RELU_CODE
    assert {"shrink", "culprit"} <= set(result.report.phase_s), result.report.phase_s


def test_a_dict_input_program_minifies_to_relu_of_a_linear_input(tmp_path: Path, test_backends_allowed: None) -> None:
    """The dict (and keyword) input form of the seed's AOTI program: the reduction keeps its pytree
    in and out specs and ends where the flat program does. A test backend that fails compiling relu
    (tests/support/backends.py) stands in for aot_inductor, whose real minimization is the test
    above: candidates reach a backend flat either way, and the specs are the reduction's."""
    result = run(tmp_path, "linear_relu_sigmoid_dict", backend=f"{PREFIX}:fail_on_relu", kind="compile_error")

    assert result.status is JobState.succeeded, result.reason
    assert result.report.signature == "RuntimeError: injected failure on relu"
    module = torch.export.load(result.artifacts["minimized.pt2"]).module(check_guards=False)
    assert str(module.code).strip() == AOTI_RELU_CODE
