"""The shrink phase: once the graph is minimal, its tensor inputs are halved while the failure holds.

The first tests are pure (candidates, slicing, the search over a thread evaluator); the engine tests
run real sandbox children with the cheap backends of tests/support/backends.py, and the repro in a
fresh Python.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.fx as fx

from examples.programs import Chain
from minify_contract.models import JobSpec, JobState, Milestone, ProgressEvent
from minify_contract.specflags import add_spec_arguments, spec_from_args
from minify_worker.engine import MinifyResult, minify
from minify_worker.engine.scheduler import Scheduler
from minify_worker.programs.fx import graph as g
from minify_worker.programs.fx import shrink
from minify_worker.programs.fx.backends import ALLOWED_BACKENDS_ENV
from minify_worker.programs.fx.run import build_candidate
from tests.support.backends import ALLOWED, PREFIX
from tests.support.evaluators import ThreadEvaluator, still_fails
from tests.support.graphs import ops_of
from tests.support.repro import run_repro


def matmul_graph(x: list[int], w: list[int]) -> fx.Graph:
    """x @ w, both read from the value store, with the meta the loader gives static inputs."""
    graph = fx.Graph()
    inputs = []
    for name, shape in (("x", x), ("w", w)):
        node = graph.placeholder(name)
        node.meta.update({g.META_VALUE: name, g.META_KIND: "tensor",
                          g.META_TENSOR: {"shape": shape, "dtype": "float32", "device": "cpu",
                                          "stride": list(torch.empty(shape).stride())}})
        inputs.append(node)
    graph.output((graph.call_function(torch.ops.aten.mm.default, tuple(inputs)),))
    return graph


def sizes_of(graph: fx.Graph) -> dict[str, list[int]]:
    return shrink.input_sizes(graph)


def run_shrink(graph: fx.Graph, fails: Callable[[dict[str, list[int]]], bool], parallelism: int = 2,
               max_checks: int = shrink.MAX_CHECKS) -> shrink.Shrinking:
    evaluator = ThreadEvaluator(lambda candidate: fails(sizes_of(candidate)))
    scheduler = Scheduler(evaluator, still_fails, parallelism=parallelism)
    return shrink.shrink(scheduler, graph, max_checks=max_checks)


# --- candidates and values ------------------------------------------------------------------


def test_a_halved_input_carries_its_sizes_in_its_meta_and_its_identity() -> None:
    graph = matmul_graph([256, 128], [128, 64])

    smaller = shrink.halved(graph, [("x", 0), ("x", 1)])

    x = g.placeholders(smaller)[0]
    assert x.meta[g.META_NARROW] == [128, 64]
    assert x.meta[g.META_TENSOR]["shape"] == [128, 64] and x.meta[g.META_TENSOR]["stride"] == [64, 1]
    assert sizes_of(graph) == {"x": [256, 128], "w": [128, 64]}  # the argument is not touched
    assert g.structural_hash(smaller) != g.structural_hash(graph)
    assert g.structural_hash(smaller) != g.structural_hash(shrink.halved(graph, [("x", 0)]))
    assert g.placeholders(g.graph_from_wire(g.graph_to_wire(smaller)))[0].meta[g.META_NARROW] == [128, 64]


def test_a_round_halves_everything_then_each_size_then_each_dim() -> None:
    graph = matmul_graph([256, 128], [128, 64])

    offered = [sorted(dims) for dims, _ in shrink.candidates(graph, set())]

    assert offered == [
        [("w", 0), ("w", 1), ("x", 0), ("x", 1)],
        [("w", 0), ("x", 1)],  # the dims of one size: 128
        [("x", 0)], [("x", 1)], [("w", 0)], [("w", 1)],  # alone, largest first
    ]


def test_a_dim_beside_tied_dims_of_its_size_is_left_out_last() -> None:
    graph = matmul_graph([64, 64], [64, 64])

    offered = [sorted(dims) for dims, _ in shrink.candidates(graph, set())]

    assert len(offered) == 1 + 4 + 4  # all (the one size too), each alone, all but one
    assert offered[-1] == [("w", 0), ("x", 0), ("x", 1)]


def test_dims_that_are_done_or_of_size_one_are_not_offered() -> None:
    graph = matmul_graph([1, 8], [8, 4])

    offered = [sorted(dims) for dims, _ in shrink.candidates(graph, {("w", 1)})]

    assert offered == [[("w", 0), ("x", 1)], [("x", 1)], [("w", 0)]]


def test_the_child_slices_the_stored_value_to_the_leading_block() -> None:
    graph = shrink.halved(matmul_graph([4, 6], [6, 2]), [("x", 0), ("x", 1), ("w", 0)])
    values = {"x": torch.arange(24.0).reshape(4, 6), "w": torch.arange(12.0).reshape(6, 2)}

    _, (x, w) = build_candidate(g.graph_to_wire(graph), values)

    assert torch.equal(x, values["x"][:2, :3]) and x.is_contiguous()
    assert torch.equal(w, values["w"][:3, :2])
    assert x.untyped_storage().nbytes() == 6 * 4  # a copy, not a view of the big storage


def test_a_sliced_transposed_input_stays_transposed() -> None:
    stored = torch.arange(24.0).reshape(6, 4).t()  # shape (4, 6), stride (1, 4)

    value = shrink.narrowed(stored, [2, 3])

    assert torch.equal(value, stored[:2, :3]) and value.stride() == (1, 2)


def test_the_meta_of_a_shrunk_transposed_input_has_the_strides_of_its_copy() -> None:
    graph = matmul_graph([4, 6], [6, 2])
    g.placeholders(graph)[0].meta[g.META_TENSOR]["stride"] = [1, 4]  # stored transposed
    stored = torch.arange(24.0).reshape(6, 4).t()

    smaller = shrink.halved(graph, [("x", 0), ("x", 1)])

    assert g.placeholders(smaller)[0].meta[g.META_TENSOR]["stride"] == list(shrink.narrowed(stored, [2, 3]).stride())


def test_a_shrunk_candidate_whose_ops_do_not_fit_its_sizes_is_not_built() -> None:
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta.update({g.META_VALUE: "x", g.META_KIND: "tensor",
                   g.META_TENSOR: {"shape": [4, 6], "dtype": "float32", "device": "cpu", "stride": [6, 1]}})
    graph.output((graph.call_function(torch.ops.aten.view.default, (x, [24])),))
    values = {"x": torch.randn(4, 6)}

    build_candidate(g.graph_to_wire(graph), values)
    with pytest.raises(RuntimeError, match="invalid for input of size 12"):
        build_candidate(g.graph_to_wire(shrink.halved(graph, [("x", 0)])), values)


def test_a_value_smaller_than_the_sizes_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot narrow"):
        shrink.narrowed(torch.zeros(2, 2), [4, 2])


def test_dynamic_dims_are_not_shrunk_unless_compiled_static() -> None:
    graph = matmul_graph([256, 128], [128, 64])
    g.placeholders(graph)[0].meta[g.META_TENSOR]["dynamic"] = {"0": {"name": "s0", "min": 2, "max": 512}}

    assert "x has dynamic dims" in (shrink.not_shrinkable(graph, "as_exported") or "")
    assert shrink.not_shrinkable(graph, "static") is None


def test_a_graph_without_tensor_inputs_says_so() -> None:
    graph = fx.Graph()
    n = graph.placeholder("n")
    n.meta.update({g.META_VALUE: "n", g.META_KIND: "scalar"})
    graph.output((graph.call_function(torch.ops.aten.scalar_tensor.default, (n,)),))

    assert shrink.not_shrinkable(graph, "as_exported") == "no tensor input (n: not tensors)"


# --- the search ------------------------------------------------------------------------------


def test_the_first_round_opens_with_every_dim_at_one() -> None:
    graph = matmul_graph([256, 128], [128, 64])

    (first_dims, first), (second_dims, _) = list(shrink.candidates(graph, set(), first=True))[:2]

    assert sizes_of(first.graph) == {"x": [1, 1], "w": [1, 1]}
    assert first_dims == second_dims  # then every dim halved


def test_a_size_independent_failure_goes_to_ones_in_one_check() -> None:
    done = run_shrink(matmul_graph([256, 128], [128, 64]), lambda sizes: sizes["x"][1] == sizes["w"][0],
                      parallelism=1)

    assert sizes_of(done.graph) == {"x": [1, 1], "w": [1, 1]}
    assert done.checks == 1


def test_a_failure_that_needs_more_than_one_element_halves_down_to_it() -> None:
    done = run_shrink(matmul_graph([256, 128], [128, 64]),
                      lambda sizes: sizes["x"][1] == sizes["w"][0] and sizes["x"][0] >= 2)

    assert sizes_of(done.graph) == {"x": [2, 1], "w": [1, 1]}
    assert len(done.accepted) == 7  # halving everything at once, six times, then the 4 alone


def test_a_size_dependent_failure_stops_at_the_last_size_that_fails() -> None:
    done = run_shrink(matmul_graph([256, 128], [128, 64]),
                      lambda sizes: sizes["x"][1] == sizes["w"][0] and sizes["x"][0] >= 64)

    assert sizes_of(done.graph) == {"x": [64, 1], "w": [1, 1]}


def test_tied_dims_shrink_together_when_another_dim_cannot() -> None:
    # w's 64 must stay; x's 128 and w's 128 only work together (a matmul's K).
    done = run_shrink(matmul_graph([256, 128], [128, 64]),
                      lambda sizes: sizes["x"][1] == sizes["w"][0] and sizes["w"][1] >= 64)

    assert sizes_of(done.graph) == {"x": [1, 1], "w": [1, 64]}


def test_the_search_is_the_same_at_any_parallelism() -> None:
    def fails(sizes: dict[str, list[int]]) -> bool:
        return sizes["x"][1] == sizes["w"][0] and sizes["x"][0] >= 32 and sizes["w"][1] >= 8

    one = run_shrink(matmul_graph([256, 128], [128, 64]), fails, parallelism=1)
    four = run_shrink(matmul_graph([256, 128], [128, 64]), fails, parallelism=4)

    assert one.accepted == four.accepted and sizes_of(one.graph) == {"x": [32, 1], "w": [1, 8]}


def test_the_phase_stops_at_its_check_budget() -> None:
    done = run_shrink(matmul_graph([4096, 4096], [4096, 4096]), lambda sizes: sizes["x"][0] >= 2, max_checks=3)

    assert done.checks <= 3
    assert sizes_of(done.graph)["x"][0] >= 1024


# --- the engine ------------------------------------------------------------------------------


class ViewRelu(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x.view(256 * 128)).cos()


def save(module: torch.nn.Module, directory: Path, *args: torch.Tensor, **export: object) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "program.pt2"
    torch.export.save(torch.export.export(module, args, **export), path)  # type: ignore[arg-type]
    return path


def run_job(directory: Path, program: Path, backend: str, **spec: object) -> tuple[MinifyResult, list[ProgressEvent]]:
    events: list[ProgressEvent] = []
    job_spec = JobSpec.model_validate({"backend": f"{PREFIX}:{backend}",
                                       "limits": {"candidate_timeout_s": 20, "parallelism": 2}, **spec})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ALLOWED_BACKENDS_ENV, PREFIX)
        result = minify(program, job_spec, directory / "out", on_event=events.append)
    return result, events


@pytest.fixture(scope="module")
def relu_job(tmp_path_factory: pytest.TempPathFactory) -> MinifyResult:
    """sin, relu, cos on a 256x128 input; compiling relu fails whatever the sizes."""
    directory = tmp_path_factory.mktemp("relu")
    program = save(Chain(("sin", "relu", "cos")), directory, torch.randn(256, 128))
    result, _ = run_job(directory, program, "fail_on_relu")
    return result


def test_a_relu_bug_on_a_large_input_ends_on_a_one_element_input(relu_job: MinifyResult) -> None:
    report = relu_job.report

    assert relu_job.status is JobState.succeeded, relu_job.reason
    assert ops_of(report.graph_code) == ["relu"]
    assert report.signature == "RuntimeError: injected failure on relu"
    assert {name: shape.model_dump() for name, shape in report.input_shapes_original.items()} == {
        "sin": {"shape": [256, 128], "dtype": "float32"}}
    assert {name: shape.shape for name, shape in report.input_shapes_final.items()} == {"sin": [1, 1]}
    assert "shrink" in report.phase_s


def test_the_artifacts_use_the_shrunk_shapes(relu_job: MinifyResult) -> None:
    (value,) = torch.load(relu_job.artifacts["inputs.pt"], weights_only=True)
    program = torch.export.load(relu_job.artifacts["minimized.pt2"])

    assert value.shape == (1, 1) and value.untyped_storage().nbytes() == 4
    (placeholder,) = [node for node in program.graph.nodes if node.op == "placeholder"]
    assert tuple(placeholder.meta["val"].shape) == (1, 1)


def test_the_repro_reproduces_with_the_shrunk_shapes_in_a_fresh_process(relu_job: MinifyResult) -> None:
    repro = relu_job.artifacts["repro.py"]
    done = run_repro(repro, **ALLOWED)

    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert "repro failed with: RuntimeError: injected failure on relu" in done.stderr


def test_a_size_dependent_bug_stops_at_the_smallest_size_that_fails(tmp_path: Path) -> None:
    program = save(Chain(("sin", "relu", "cos")), tmp_path, torch.randn(256, 128))

    result, _ = run_job(tmp_path, program, "fail_on_relu_with_a_dim_of_64_or_more")

    assert result.status is JobState.succeeded, result.reason
    # The signature normalizes numbers: 64 is N.
    assert result.report.signature == "RuntimeError: injected failure on relu with a dim of N or more"
    assert {name: shape.shape for name, shape in result.report.input_shapes_final.items()} == {"sin": [64, 1]}


def test_a_view_to_a_literal_size_keeps_its_input_size_and_the_failure(tmp_path: Path) -> None:
    program = save(ViewRelu(), tmp_path, torch.randn(256, 128))

    result, _ = run_job(tmp_path, program, "fail_after_running_view_and_relu")

    assert result.status is JobState.succeeded, result.reason
    assert ops_of(result.report.graph_code) == ["view", "relu"]
    assert result.report.signature == "RuntimeError: injected failure on view and relu"
    assert {name: shape.shape for name, shape in result.report.input_shapes_final.items()} == {"x": [256, 128]}
    assert result.report.outcomes.get("invalid", 0) >= 1  # the view does not fit a smaller input


def test_a_program_with_dynamic_dims_is_not_shrunk_and_says_why(tmp_path: Path) -> None:
    batch = torch.export.Dim("batch", min=2, max=512)
    program = save(Chain(("sin", "relu")), tmp_path, torch.randn(256, 16), dynamic_shapes={"x": {0: batch}})

    result, events = run_job(tmp_path, program, "fail_on_relu")

    assert result.status is JobState.succeeded, result.reason
    assert result.report.input_shapes_final == result.report.input_shapes_original
    assert any(event.milestone is Milestone.shrink_skipped and "dynamic dims" in (event.message or "")
               for event in events if event.phase == "shrink")


def test_no_shrink_keeps_the_sizes_and_skips_the_phase(tmp_path: Path) -> None:
    program = save(Chain(("sin", "relu")), tmp_path, torch.randn(64, 8))

    result, _ = run_job(tmp_path, program, "fail_on_relu", shrink=False)

    assert result.status is JobState.succeeded, result.reason
    assert {name: shape.shape for name, shape in result.report.input_shapes_final.items()} == {"sin": [64, 8]}
    assert "shrink" not in result.report.phase_s


def test_the_no_shrink_flag_turns_the_spec_field_off() -> None:
    parser = argparse.ArgumentParser()
    add_spec_arguments(parser)

    assert spec_from_args(parser.parse_args([])).shrink is True
    assert spec_from_args(parser.parse_args(["--no-shrink"])).shrink is False

