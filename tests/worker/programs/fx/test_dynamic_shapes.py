"""Dynamic shapes survive minimization (issue 15, point 1).

A program exported with `Dim("batch", min=2, max=64)` keeps that dim symbolic in every candidate
(the backend sees SymInt sizes, as torch.compile with dynamic shapes gives them), in minimized.pt2
(its range constraint) and in repro.py. The engine tests use `fail_on_symbolic_relu`
(tests/support/backends.py), which fails on relu only when it is compiled with symbolic sizes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.export import Dim
from torch.utils._sympy.numbers import int_oo

from minify_contract.models import JobSpec, JobState
from minify_worker.engine import MinifyResult, minify
from minify_worker.outcomes import Fails, Passes
from minify_worker.programs.fx.artifacts import export_minimized, write_program_files
from minify_worker.programs.fx.backends import ALLOWED_BACKENDS_ENV, dynamic_shapes_of, resolve_backend
from minify_worker.programs.fx.graph import (
    derive,
    flat_graph_from_exported_program,
    graph_from_wire,
    graph_to_wire,
    placeholders,
    to_graph_module,
)
from minify_worker.programs.fx.prepare import concrete_values, placeholder_values
from minify_worker.programs.fx.run import run_wire_candidate
from tests.support.backends import PREFIX
from tests.support.graphs import ops_of
from tests.support.repro import run_repro

BACKEND = f"{PREFIX}:fail_on_symbolic_relu"
SIGNATURE = "RuntimeError: injected failure on relu with symbolic sizes"


class _Chain(torch.nn.Module):
    """sin -> relu -> cos -> exp over a (batch, 16) input, batch exported dynamic."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(torch.cos(torch.relu(torch.sin(x) * 2)))


class _Project(torch.nn.Module):
    """relu(x @ weight): x's batch exported dynamic, the weight (an input) static."""

    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ weight)


class _TwoInputs(torch.nn.Module):
    """x and z share the batch dim (z's is twice it)."""

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.relu(x.sin()), z.cos()


def export_chain() -> torch.export.ExportedProgram:
    return torch.export.export(_Chain(), (torch.randn(8, 16),),
                               dynamic_shapes={"x": {0: Dim("batch", min=2, max=64)}})


def save_chain(directory: Path) -> Path:
    path = directory / "chain_dynamic.pt2"
    torch.export.save(export_chain(), path)
    return path


def spec(dynamic: str | None = None) -> JobSpec:
    data: dict[str, Any] = {"backend": BACKEND, "limits": {"candidate_timeout_s": 30, "parallelism": 2}}
    if dynamic is not None:
        data["dynamic"] = dynamic
    return JobSpec.model_validate(data)


@pytest.fixture(scope="module")
def dynamic_job(tmp_path_factory: pytest.TempPathFactory) -> MinifyResult:
    """The sin-relu-cos-exp program minimized once with the spec's default (`as_exported`)."""
    directory = tmp_path_factory.mktemp("dynamic")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ALLOWED_BACKENDS_ENV, PREFIX)
        return minify(save_chain(directory), spec(), directory / "out")


# ---------------------------------------------------------------------------------------------
# What the loader records, and what the graph operations keep


def test_the_loader_records_each_inputs_dynamic_dims_with_their_range() -> None:
    graph = flat_graph_from_exported_program(export_chain())

    (x,) = placeholders(graph)

    assert x.meta["minify_tensor"]["dynamic"] == {"0": {"name": _symbol_of(x), "min": 2, "max": 64}}
    assert x.meta["minify_tensor"]["shape"] == [8, 16]  # the example's sizes stay the hint


def test_dims_derived_from_the_same_symbol_share_its_name() -> None:
    batch = Dim("batch", min=2, max=64)
    ep = torch.export.export(_TwoInputs(), (torch.randn(8, 4), torch.randn(16, 3)),
                             dynamic_shapes={"x": {0: batch}, "z": {0: 2 * batch}})

    x, z = placeholders(flat_graph_from_exported_program(ep))

    assert z.meta["minify_tensor"]["dynamic"]["0"] == {**x.meta["minify_tensor"]["dynamic"]["0"], "scale": 2}


class _Windows(torch.nn.Module):
    """A size divided by the batch (Swin's windows per image): `64 // s + 2` is not linear in s."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x.new_ones(64 // x.shape[0] + 2))


def test_a_size_that_divides_by_a_symbol_is_a_dim_of_its_own() -> None:
    ep = torch.export.export(_Windows(), (torch.randn(8, 4),), dynamic_shapes={"x": {0: Dim("b", min=2, max=16)}})

    graph = flat_graph_from_exported_program(ep)

    [dim] = [node.meta["minify_tensor"]["dynamic"]["0"] for node in graph.nodes if node.name == "relu"]
    assert "expr" in dim and dim["name"] == "relu_0"


def test_a_promoted_intermediate_keeps_its_symbolic_sizes_on_the_wire() -> None:
    graph = flat_graph_from_exported_program(export_chain())
    relu_input = next(node.name for node in graph.nodes if node.name.startswith("mul"))

    promoted = graph_from_wire(json.loads(json.dumps(graph_to_wire(derive(graph, promote=[relu_input])))))

    (placeholder,) = placeholders(promoted)
    assert placeholder.name == relu_input
    assert placeholder.meta["minify_tensor"]["dynamic"]["0"]["min"] == 2
    assert placeholder.meta["minify_tensor"]["dynamic"]["0"]["max"] == 64


def test_an_exported_candidate_keeps_the_range_of_a_promoted_input() -> None:
    graph = flat_graph_from_exported_program(export_chain())
    relu_input = next(node.name for node in graph.nodes if node.name.startswith("mul"))
    candidate = derive(graph, promote=[relu_input])

    program = export_minimized(candidate, (torch.randn(8, 16),))

    assert [(bound.lower, bound.upper) for bound in program.range_constraints.values()] == [(2, 64)]
    static = export_minimized(candidate, (torch.randn(8, 16),), dynamic="static")
    assert static.range_constraints == {}


def test_auto_exports_the_dynamic_dims_without_their_upper_bound() -> None:
    graph = flat_graph_from_exported_program(export_chain())

    program = export_minimized(graph, (torch.randn(8, 16),), dynamic="auto")

    (bound,) = program.range_constraints.values()
    assert (bound.lower, bound.upper) == (2, int_oo)  # Dim.AUTO: dynamic, unbounded above


def test_the_job_spec_compiles_as_exported_by_default() -> None:
    assert JobSpec().dynamic == "as_exported"
    assert JobSpec.model_validate({"dynamic": "static"}).dynamic == "static"
    with pytest.raises(ValueError):
        JobSpec.model_validate({"dynamic": "sometimes"})


def _symbol_of(node: torch.fx.Node) -> str:
    return node.meta["minify_tensor"]["dynamic"]["0"]["name"]


# ---------------------------------------------------------------------------------------------
# One candidate (in this process)


def run_chain(backend: str, dynamic: str, tmp_path: Path, ep: torch.export.ExportedProgram | None = None) -> object:
    ep = ep or export_chain()
    graph = flat_graph_from_exported_program(ep)
    values = placeholder_values(ep, graph, [torch.randn(8, 16)])
    values.update(concrete_values(graph, values, "cpu"))
    spec = JobSpec.model_validate({"backend": backend, "dynamic": dynamic})
    return run_wire_candidate(graph_to_wire(graph), values, spec, tmp_path)


@pytest.mark.parametrize("dynamic", ["as_exported", "auto"])
def test_the_backend_sees_symbolic_sizes_unless_static(dynamic: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALLOWED_BACKENDS_ENV, PREFIX)

    outcome = run_chain(BACKEND, dynamic, tmp_path)

    assert isinstance(outcome, Fails) and outcome.signature.text == SIGNATURE
    assert not isinstance(run_chain(BACKEND, "static", tmp_path), Fails)


@pytest.mark.parametrize("bounds", [{"min": 2}, {"max": 64}, {}])
def test_a_dim_bounded_at_one_end_or_none_is_compiled_symbolic(bounds: dict[str, int], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALLOWED_BACKENDS_ENV, PREFIX)
    ep = torch.export.export(_Chain(), (torch.randn(8, 16),), dynamic_shapes={"x": {0: Dim("batch", **bounds)}})

    outcome = run_chain(BACKEND, "as_exported", tmp_path, ep)

    assert isinstance(outcome, Fails) and outcome.signature.text == SIGNATURE, outcome


def fail_on_relu_with_a_symbolic_static_dim(gm: torch.fx.GraphModule,
                                             example_inputs: list[Any]) -> Callable[..., Any]:
    """A test backend: fails on relu when a tensor placeholder's example value (dynamo's fake one:
    the example inputs are real) has a symbolic size past its first dim, which `_Project` exports
    static; else eager."""
    values = [node.meta.get("example_value") for node in gm.graph.nodes if node.op == "placeholder"]
    symbolic = any(isinstance(value, torch.Tensor) and any(isinstance(size, torch.SymInt) for size in value.shape[1:])
                   for value in values)
    if symbolic and any(node.target is torch.ops.aten.relu.default for node in gm.graph.nodes):
        raise RuntimeError("injected failure on relu with a symbolic static dim")
    return gm.forward


def test_dims_the_program_keeps_static_stay_static_when_the_config_assumes_dynamic(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A capture of torch.compile(dynamic=True) records the assume_static_by_default=False it sets;
    # the weight (an input here, a parameter in the user's compile) must not turn symbolic.
    monkeypatch.setenv(ALLOWED_BACKENDS_ENV, __name__)
    ep = torch.export.export(_Project(), (torch.randn(8, 16), torch.randn(16, 4)),
                             dynamic_shapes={"x": {0: Dim("batch", min=2)}, "weight": None})
    graph = flat_graph_from_exported_program(ep)
    values = placeholder_values(ep, graph, [torch.randn(8, 16), torch.randn(16, 4)])
    spec = JobSpec.model_validate({"backend": f"{__name__}:fail_on_relu_with_a_symbolic_static_dim",
                                   "config": {"torch._dynamo.config.assume_static_by_default": False}})

    with torch._dynamo.config.patch(assume_static_by_default=False):  # restored after the run sets it
        outcome = run_wire_candidate(graph_to_wire(graph), values, spec, tmp_path)

    assert isinstance(outcome, Passes), outcome


def test_the_repro_keeps_static_the_dims_the_program_keeps_static(tmp_path: Path) -> None:
    ep = torch.export.export(_Project(), (torch.randn(8, 16), torch.randn(16, 4)),
                             dynamic_shapes={"x": {0: Dim("batch", min=2)}, "weight": None})
    graph = flat_graph_from_exported_program(ep)
    values = placeholder_values(ep, graph, [torch.randn(8, 16), torch.randn(16, 4)])
    backend = "tests.worker.programs.fx.test_dynamic_shapes:fail_on_relu_with_a_symbolic_static_dim"
    spec = JobSpec.model_validate({"backend": backend,
                                   "config": {"torch._dynamo.config.assume_static_by_default": False}})
    write_program_files(graph, values, tmp_path, spec)

    done = run_repro(tmp_path / "repro.py")

    assert done.returncode == 0 and "repro passed" in done.stdout, done.stdout + done.stderr[-3000:]


@pytest.mark.parametrize(("backend", "kind"), [("fail_on_relu", "compile_error"),
                                               ("fail_on_relu_at_runtime", "runtime_error")])
def test_through_dynamo_compile_and_run_errors_keep_their_kind(backend: str, kind: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALLOWED_BACKENDS_ENV, PREFIX)

    outcome = run_chain(f"{PREFIX}:{backend}", "as_exported", tmp_path)

    assert isinstance(outcome, Fails)
    assert (outcome.signature.kind, outcome.signature.text) == (kind, "RuntimeError: injected failure on relu")


@pytest.mark.inductor
def test_inductor_compiles_one_graph_for_every_batch_size_in_range(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    graph = flat_graph_from_exported_program(export_chain())
    backend = resolve_backend("inductor", tmp_path, dynamic_shapes_of(graph, "as_exported"))
    compiled = backend(to_graph_module(graph), [torch.randn(8, 16)])
    monkeypatch.setattr(torch._dynamo.config, "error_on_recompile", True)

    for batch in (3, 64):
        x = torch.randn(batch, 16)
        torch.testing.assert_close(compiled(x)[0], _Chain()(x))


@pytest.mark.inductor
def test_aot_inductor_compiles_with_the_programs_dynamic_shapes(tmp_path: Path) -> None:
    graph = flat_graph_from_exported_program(export_chain())
    backend = resolve_backend("aot_inductor", tmp_path, dynamic_shapes_of(graph, "as_exported"))
    compiled = backend(to_graph_module(graph), [torch.randn(8, 16)])

    x = torch.randn(5, 16)
    torch.testing.assert_close(compiled(x)[0], _Chain()(x))


# ---------------------------------------------------------------------------------------------
# Through the engine


def test_a_bug_that_needs_symbolic_shapes_is_minimized(dynamic_job: MinifyResult) -> None:
    assert dynamic_job.status is JobState.succeeded, dynamic_job.reason
    assert ops_of(dynamic_job.report.graph_code or "") == ["relu"]
    assert dynamic_job.report.signature == SIGNATURE


def test_the_minimized_program_keeps_the_batch_dims_range(dynamic_job: MinifyResult) -> None:
    program = torch.export.load(dynamic_job.artifacts["minimized.pt2"])

    assert [(bound.lower, bound.upper) for bound in program.range_constraints.values()] == [(2, 64)]
    (user_input,) = [node for node in program.graph.nodes if node.op == "placeholder"]
    assert isinstance(user_input.meta["val"].shape[0], torch.SymInt)


def test_the_repro_of_a_dynamic_shape_bug_reproduces_in_a_fresh_process(dynamic_job: MinifyResult) -> None:
    repro = dynamic_job.artifacts["repro.py"]
    done = run_repro(repro)

    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert f"repro failed with: {SIGNATURE}" in done.stderr


def test_static_shapes_do_not_reproduce_a_symbolic_only_bug(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALLOWED_BACKENDS_ENV, PREFIX)

    result = minify(save_chain(tmp_path), spec("static"), tmp_path / "out")

    assert result.status is JobState.not_reproducible
