"""Floating-point outputs whose size the values decide (issue 38, pytorch#148859's class): `unique`,
`unique_consecutive`, `masked_select`, compiled under dynamo's `capture_dynamic_output_shape_ops`.
A compiled graph that returns another size than eager's cannot be compared by torch's accuracy rule
(`allclose` of two shapes raises, or broadcasts a size of one); the rule minify shares with the worker
and repro.py (`minify_contract.accuracy.size_divergence`) lets the fp64 reference tell the two cases
apart:

- rounding: the size hinges on last-bit differences (`0.1 + 0.2` against `0.3` is equal in float32,
  not in float64); a backend that computes in float64 gets the fp64 reference's size, not eager's,
  and eager's rounding decided the size as much as the compiled code's: said, not captured;
- a wrong size: a backend that drops the last value, where the fp64 reference has eager's size:
  captured as an accuracy failure that names both shapes.

In both the program's own outcome is unchanged. Cheap backends, no compiler.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import fx

from minify_client.capture import capture_failures
from minify_worker.outcomes import Fails
from tests.support.backends import drop_last_float_output, in_fp64
from tests.support.captures import run_as_the_worker

Backend = Callable[[fx.GraphModule, list[Any]], Callable[..., Any]]


PROGRAMS: list[tuple[str, Callable[..., torch.Tensor]]] = [
    ("unique_consecutive", lambda x, y, z: torch.unique_consecutive(torch.cat([x + y, z]))),
    ("unique", lambda x, y, z: torch.unique(torch.cat([x + y, z]))),
    ("masked_select", lambda x, y, z: torch.masked_select(z * 2, x + y >= z)),
]
# float32: 0.1 + 0.2 == 0.3 (one value, a true mask); float64 of the same float32 numbers: not. Two
# values at least each way: torch's allclose broadcasts a size of one.
ROUNDING = (torch.tensor([1.0, 0.1]), torch.tensor([1.0, 0.2]), torch.tensor([0.3, 0.3]))
EXACT = (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 1.0]), torch.tensor([1.5, 3.0]))


def compile_and_capture(program: Callable[..., torch.Tensor], args: tuple[torch.Tensor, ...], backend: Backend,
                        directory: Path, caplog: pytest.LogCaptureFixture) -> tuple[torch.Tensor, Any, list[str]]:
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True), caplog.at_level("WARNING"), \
            capture_failures(program, args, save_to=directory, accuracy=True) as captured:
        result = torch.compile(program, backend=backend, fullgraph=True)(*args)
    torch._dynamo.reset()
    said = [record.getMessage() for record in caplog.records if "a size the values decide" in record.getMessage()]
    return result, captured, said


@pytest.mark.parametrize(("name", "program"), PROGRAMS, ids=[case[0] for case in PROGRAMS])
def test_a_size_rounding_decides_is_said_as_rounding_and_not_captured(
        name: str, program: Callable[..., torch.Tensor], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    expected = program(*ROUNDING)
    result, captured, said = compile_and_capture(program, ROUNDING, in_fp64, tmp_path, caplog)

    assert result.shape != expected.shape  # the program's own outcome, unchanged by the check
    assert captured.captured is None
    assert len(said) == 1, said
    assert f"where eager's has {tuple(expected.shape)}" in said[0]
    assert f"the fp64 reference's is {tuple(result.shape)}, not eager's" in said[0]
    assert "not a compiler error" in said[0]


@pytest.mark.parametrize(("name", "program"), PROGRAMS, ids=[case[0] for case in PROGRAMS])
def test_a_wrong_size_is_captured_as_an_accuracy_failure_naming_both_shapes(
        name: str, program: Callable[..., torch.Tensor], tmp_path: Path, caplog: pytest.LogCaptureFixture,
        test_backends_allowed: None) -> None:
    expected = program(*EXACT)
    result, captured, said = compile_and_capture(program, EXACT, drop_last_float_output, tmp_path, caplog)

    assert tuple(result.shape) == (expected.numel() - 1,)  # the program's own outcome, unchanged by the check
    assert captured.captured is not None and not said
    spec = captured.captured.spec
    assert spec.failure.kind == "accuracy" and spec.failure.signature == "AccuracyError", spec.failure
    assert any(f"shape {tuple(result.shape)}, eager {tuple(expected.shape)} (the fp64 reference's too)" in link
               for link in captured.captured.chain), captured.captured.chain
    # The worker's run of the captured program judges it the same way, with the same signature.
    outcome = run_as_the_worker(tmp_path)
    assert isinstance(outcome, Fails), outcome
    assert outcome.signature.key == "" and "float output 0: shape" in outcome.signature.text, outcome.signature


def test_a_wrong_size_is_minimized_and_its_repro_fails_with_both_shapes(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, test_backends_allowed: None) -> None:
    from minify_worker.engine import minify
    from tests.support.graphs import ops_of
    from tests.support.repro import run_repro

    def program(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return torch.unique_consecutive(torch.cat([torch.relu(x) + y.cos(), z])) * 2

    _, captured, _ = compile_and_capture(program, EXACT, drop_last_float_output, tmp_path / "capture", caplog)
    assert captured.captured is not None and captured.captured.program is not None
    spec = captured.captured.spec.model_copy(update={"culprit": False, "versions": False, "shrink": False})

    result = minify(captured.captured.program, spec, tmp_path / "out")

    assert result.status.value == "succeeded", result.reason
    captured_ops = ops_of(torch.export.load(captured.captured.program).graph)
    assert {"relu", "cos", "add", "cat", "unique_consecutive", "mul"} <= set(captured_ops), captured_ops
    assert ops_of(result.report.graph_code) == ["unique_consecutive"], result.report.graph_code
    ran = run_repro(tmp_path / "out" / "repro.py")
    assert ran.returncode != 0 and "float output 0: shape" in ran.stderr, ran.stderr[-2000:]


def test_outputs_of_eagers_size_are_judged_as_before(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    program = PROGRAMS[0][1]
    _, captured, said = compile_and_capture(program, EXACT, in_fp64, tmp_path, caplog)

    assert captured.captured is None and not said
