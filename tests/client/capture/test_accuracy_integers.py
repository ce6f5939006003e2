"""Wrong integer and boolean values are accuracy failures (issue 38, class 1).

torch's accuracy rule (`ignore_non_fp`) compares floating-point outputs only: a compiled program
that returns a wrong int8 sum or a flipped mask passed it. `minify_contract.accuracy` compares
integer and boolean outputs exactly, in the capture's check, the worker's oracle and repro.py
(which carries the module beside it), and judges the legitimately ambiguous ones by what they
mean: indices of ties by the values they select, an unsorted unique as multisets, a scatter's
positions written twice not at all.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import fx

from minify_client.capture import capture_failures
from minify_contract.accuracy import divergence, integer_divergence
from minify_contract.models import JobSpec
from minify_worker.outcomes import Fails, Passes
from minify_worker.programs.fx.graph import flat_graph_from_exported_program, graph_to_wire
from minify_worker.programs.fx.prepare import concrete_values, placeholder_values
from minify_worker.programs.fx.run import run_wire_candidate
from tests.support.backends import PREFIX, other_ties, wrong_integers_on_bitwise_xor, wrong_integers_on_xor_after_aot
from tests.support.captures import run_as_the_worker

INTEGER_DTYPES = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]


def compared(function: Callable[..., Any], inputs: list[Any], result: Any, *, exported: bool = False) -> str | None:
    """`result` judged as the compiled result of `function` on `inputs` (its graph traced by FX, or
    exported: aten ops), with the fp64 reference the oracle computes."""
    gm = (torch.export.export(fx.symbolic_trace(function), tuple(inputs)).module() if exported
          else fx.symbolic_trace(function))
    reference = gm(*inputs)
    fp64 = gm(*[value.double() if value.is_floating_point() else value for value in inputs])
    return divergence(reference, result, fp64, gm=gm, inputs=inputs)


# ---------------------------------------------------------------------------------------------
# The rule: exact


@pytest.mark.parametrize("dtype", [*INTEGER_DTYPES, torch.bool], ids=str)
def test_one_wrong_integer_or_boolean_value_is_an_accuracy_failure(dtype: torch.dtype) -> None:
    expected = torch.arange(64).to(dtype)
    wrong = expected.clone()
    wrong[37] = ~wrong[37] if dtype == torch.bool else wrong[37] + 1

    found = divergence((expected,), (wrong,), (expected,))

    assert found is not None and "first at [37]" in found
    assert divergence((expected,), (expected.clone(),), (expected,)) is None


@pytest.mark.parametrize("strict", [False, True])
def test_a_large_integer_off_by_one_is_reported_strict_or_not(strict: bool) -> None:
    expected = torch.tensor([2**40, 7])  # within torch's rtol of 1e-3 * 2**40: strict `same` passed it

    found = divergence((expected,), (expected + torch.tensor([1, 0]),), (expected,), strict=strict)

    assert found is not None and "1 of 2 int64 values differ" in found


def test_an_integer_of_another_dtype_or_shape_is_reported() -> None:
    expected = torch.arange(4)

    assert "dtype torch.int32" in (integer_divergence((expected,), (expected.int(),)) or "")
    assert "shape (2, 2)" in (integer_divergence((expected,), (expected.reshape(2, 2),)) or "")


def test_python_integers_among_the_outputs_are_compared_too() -> None:
    assert integer_divergence((torch.ones(2), 3), (torch.ones(2), 4)) == "output 1: 4, eager 3"
    assert integer_divergence((torch.ones(2), 3), [torch.ones(2), 3]) is None  # a list for a tuple


def test_floating_outputs_keep_torchs_rule() -> None:
    x = torch.randn(64, dtype=torch.float64)
    noisy = x.float() + 1e-7

    assert divergence((x.float(),), (noisy,), (x,)) is None
    assert divergence((x.float(),), (x.float() + 1,), (x,)) is not None


def test_an_integer_that_eager_rounds_one_way_and_fp64_the_other_passes_either_way() -> None:
    # (0.1 + 0.2) * 10 is 3.0000001 in float32, 3.0000000000000004 in fp64: floor gives 3 in both,
    # but a sum that lands on the other side in fp32 gives 2: the result hinges on rounding there.
    eager, fp64 = torch.tensor([2, 5]), torch.tensor([3, 5])

    assert integer_divergence((eager,), (torch.tensor([3, 5]),), (fp64,)) is None
    assert integer_divergence((eager,), (torch.tensor([2, 5]),), (fp64,)) is None
    assert integer_divergence((eager,), (torch.tensor([2, 6]),), (fp64,)) is not None


# ---------------------------------------------------------------------------------------------
# Ambiguous integer results


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    return torch.argmax(x, dim=1)


def argmax_method(x: torch.Tensor) -> torch.Tensor:
    return x.argmax(1)


def max_indices(x: torch.Tensor) -> torch.Tensor:
    return torch.max(x, dim=1).indices


def sort_indices(x: torch.Tensor) -> torch.Tensor:
    return torch.sort(x, dim=1)[1]


def topk_indices(x: torch.Tensor) -> torch.Tensor:
    return torch.topk(x, 2, dim=1)[1]


def argmax_flattened(x: torch.Tensor) -> torch.Tensor:
    return torch.argmax(x).reshape(1)


TIE_OPS = [argmax_rows, argmax_method, max_indices, sort_indices, topk_indices]


@pytest.mark.parametrize("exported", [False, True], ids=["torch-functions", "aten"])
@pytest.mark.parametrize("function", TIE_OPS, ids=lambda function: function.__name__)
def test_indices_of_ties_picked_otherwise_are_not_reported(function: Callable[..., Any], exported: bool) -> None:
    x = torch.tensor([[3.0, 1.0, 3.0, 0.0], [2.0, 2.0, 2.0, 5.0], [1.0, 4.0, 4.0, 4.0]])

    result = other_ties(fx.symbolic_trace(function), [x])(x)

    assert not torch.equal(result, function(x))  # other indices than eager's ...
    assert compared(function, [x], result, exported=exported) is None  # ... of equal values


@pytest.mark.parametrize("function", [*TIE_OPS, argmax_flattened], ids=lambda function: function.__name__)
def test_an_index_of_a_value_that_is_not_a_tie_is_reported(function: Callable[..., Any]) -> None:
    x = torch.tensor([[3.0, 1.0, 2.0, 0.0], [2.0, 7.0, 1.0, 5.0], [1.0, 4.0, 3.0, 6.0]])
    wrong = function(x).clone()
    wrong.view(-1)[0] = (wrong.view(-1)[0] + 1) % 4

    assert compared(function, [x], wrong) is not None


def test_an_index_used_in_further_computation_is_compared_exactly() -> None:
    x = torch.tensor([[3.0, 1.0, 3.0, 0.0]])

    assert compared(lambda x: torch.argmax(x, dim=1) * 2, [x], torch.tensor([4])) is not None


@pytest.mark.parametrize("exported", [False, True], ids=["torch-functions", "aten"])
def test_an_unsorted_unique_is_compared_as_multisets_and_its_inverse_as_a_relabelling(exported: bool) -> None:
    def unique(x: torch.Tensor) -> Any:
        found = torch.unique(x, sorted=False, return_inverse=True, return_counts=True)
        return found[0], found[1], found[2]  # as dynamo's graph returns them: one getitem each

    x = torch.tensor([5, 1, 5, 3, 1, 5])
    values, inverse, counts = unique(x)
    order = torch.flip(torch.arange(values.numel()), [0])  # the same uniques, listed the other way
    relabel = torch.empty_like(order)
    relabel[order] = torch.arange(order.numel())

    assert compared(unique, [x], (values[order], relabel[inverse], counts[order]), exported=exported) is None
    assert compared(unique, [x], (values[order] + 1, relabel[inverse], counts[order]), exported=exported)
    assert compared(unique, [x], (values, torch.zeros_like(inverse), counts), exported=exported)


def test_a_scatters_positions_written_twice_are_not_compared_the_others_are() -> None:
    def scatter(target: torch.Tensor, index: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        return target.scatter(0, index, source)

    inputs = [torch.zeros(4, dtype=torch.int64), torch.tensor([1, 1, 2]), torch.tensor([10, 20, 30])]
    eager = scatter(*inputs)
    other_winner, wrong = eager.clone(), eager.clone()
    other_winner[1] = 30 - eager[1]  # position 1 was written by 10 and by 20: either may win
    wrong[2] = 31

    assert compared(scatter, inputs, other_winner) is None
    assert compared(scatter, inputs, wrong) is not None


# ---------------------------------------------------------------------------------------------
# Through the capture's check and the worker's oracle


def xor_mask(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.bitwise_xor(x, y) + x


@pytest.mark.parametrize("backend", [wrong_integers_on_bitwise_xor, wrong_integers_on_xor_after_aot],
                         ids=["dynamo-graph", "after-aot"])
@pytest.mark.parametrize("dtype", [torch.int8, torch.int64, torch.bool], ids=str)
def test_the_capture_catches_wrong_integers_and_the_worker_reproduces_them(
        backend: Any, dtype: torch.dtype, tmp_path: Path, test_backends_allowed: None) -> None:
    x, y = (torch.randint(0, 2, (16,)).to(dtype) for _ in range(2))
    function = (lambda x, y: torch.bitwise_xor(x, y) | x) if dtype == torch.bool else xor_mask
    torch._dynamo.reset()
    with capture_failures(function, (x, y), save_to=tmp_path, accuracy=True) as captured:
        torch.compile(function, backend=backend)(x, y)  # wrong values: nothing raises
    torch._dynamo.reset()

    assert captured.captured is not None, "the wrong integers went unnoticed"
    spec = JobSpec.model_validate_json((tmp_path / "spec.json").read_text())
    assert spec.failure.kind == "accuracy"
    assert isinstance(run_as_the_worker(tmp_path), Fails)


def test_the_worker_passes_a_backend_that_breaks_ties_otherwise(tmp_path: Path, test_backends_allowed: None) -> None:
    x = torch.tensor([[3.0, 1.0, 3.0, 0.0], [2.0, 2.0, 2.0, 5.0]])
    program = torch.export.export(fx.symbolic_trace(sort_indices), (x,))
    spec = JobSpec.model_validate({"backend": f"{PREFIX}:other_ties", "failure": {"kind": "accuracy"}})

    assert isinstance(run_program(program, [x], spec, tmp_path), Passes)
    wrong = JobSpec.model_validate({"backend": f"{PREFIX}:wrong_integers_on_bitwise_xor",
                                    "failure": {"kind": "accuracy"}})
    xor = torch.export.export(fx.symbolic_trace(xor_mask), (x.long(), x.long()))
    assert isinstance(run_program(xor, [x.long(), x.long()], wrong, tmp_path), Fails)


@pytest.mark.inductor
@pytest.mark.parametrize("dtype", [torch.int8, torch.bool], ids=str)
def test_inductor_wrong_integers_are_captured_and_reproduced(dtype: torch.dtype, tmp_path: Path) -> None:
    x = torch.randint(-5, 5, (16,), dtype=torch.int8) if dtype == torch.int8 else torch.randn(16)

    def program(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2 if dtype == torch.int8 else torch.relu(x) > 0.5

    torch._dynamo.reset()
    with torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "accuracy"}), \
            capture_failures(program, (x,), save_to=tmp_path, accuracy=True) as captured:
        torch.compile(program)(x)
    torch._dynamo.reset()

    assert captured.captured is not None
    spec = JobSpec.model_validate_json((tmp_path / "spec.json").read_text())
    assert spec.backend == "inductor" and spec.failure.kind == "accuracy"
    outcome = run_as_the_worker(tmp_path)
    assert isinstance(outcome, Fails) and "values differ from eager" in outcome.signature.text, outcome


def run_program(program: torch.export.ExportedProgram, inputs: list[Any], spec: JobSpec, workdir: Path) -> Any:
    graph = flat_graph_from_exported_program(program)
    values = placeholder_values(program, graph, inputs)
    values.update(concrete_values(graph, values, "cpu"))
    return run_wire_candidate(graph_to_wire(graph), values, spec, workdir)


def test_an_integer_accuracy_bug_is_minimized_and_its_repro_judges_integers_exactly(
        tmp_path: Path, test_backends_allowed: None) -> None:
    from minify_worker.engine import minify
    from tests.support.graphs import ops_of
    from tests.support.repro import run_repro

    def program(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.bitwise_xor(x * 3, y).sum(0) + torch.argmax(x, dim=0)

    inputs = (torch.randint(0, 9, (4, 6)), torch.randint(0, 9, (4, 6)))
    path = tmp_path / "program.pt2"
    torch.export.save(torch.export.export(fx.symbolic_trace(program), inputs), path)
    spec = JobSpec.model_validate({"backend": f"{PREFIX}:wrong_integers_on_bitwise_xor",
                                   "failure": {"kind": "accuracy"}, "culprit": False, "versions": False,
                                   "shrink": False, "limits": {"candidate_timeout_s": 60, "parallelism": 2}})

    result = minify(path, spec, tmp_path / "out")

    assert result.status.value == "succeeded", result.reason
    assert ops_of(result.report.graph_code or "") == ["bitwise_xor"]
    repro = tmp_path / "out" / "repro.py"
    ran = run_repro(repro)
    assert ran.returncode != 0 and "values differ from eager" in ran.stderr, ran.stderr[-2000:]
    (tmp_path / "out" / "accuracy_rules.py").unlink()  # a repro pasted alone: integers still exact
    alone = run_repro(repro)
    assert alone.returncode != 0 and "AccuracyError: Bad accuracy detected" in alone.stderr, alone.stderr[-2000:]
