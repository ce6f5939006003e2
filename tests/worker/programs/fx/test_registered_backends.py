"""Backends named as torch.compile knows them (`torch._dynamo.list_backends()`), resolved on the
worker: torch's own after_dynamo minifier test backends minimize the seed graph to the relu, and a
name the worker does not have fails the job saying which it has (backends.registered_backend)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from examples import programs
from minify_contract.models import JobSpec, JobState
from minify_worker.engine import minify
from minify_worker.programs.fx.backends import as_torch_functions
from tests.support.graphs import ops_of
from tests.support.repro import run_repro


def spec(backend: str, **failure: object) -> JobSpec:
    return JobSpec.model_validate({"backend": backend, "failure": failure, "shrink": False, "culprit": False,
                                   "limits": {"parallelism": 2, "candidate_timeout_s": 60}})


@pytest.fixture(scope="module")
def seed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The seed's relu → cos program (examples/programs.py), saved once."""
    ep, _ = programs.relu_cos()
    path = tmp_path_factory.mktemp("seed") / "relu_cos.pt2"
    torch.export.save(ep, path)
    return path


def test_the_spec_takes_any_backend_name_shaped_like_an_identifier() -> None:
    for name in ("tensorrt", "openxla", "relu_compile_error_TESTING_ONLY", "inductor", "pkg.module:fn"):
        assert JobSpec(backend=name).backend == name
    with pytest.raises(ValidationError, match=r"registered torch\.compile backend"):
        JobSpec(backend="not a backend")


@pytest.mark.parametrize(("backend", "failure", "signature"), [
    ("relu_compile_error_TESTING_ONLY", {}, "ReluCompileError"),
    ("relu_runtime_error_TESTING_ONLY", {}, "AssertionError: ReluRuntimeError"),
    ("relu_accuracy_error_TESTING_ONLY", {"kind": "accuracy"}, "AccuracyError"),
])
def test_torchs_minifier_backends_minimize_the_seed_to_the_relu(
        backend: str, failure: dict, signature: str, seed: Path, tmp_path: Path) -> None:
    result = minify(seed, spec(backend, **failure), tmp_path / "out")

    assert result.status is JobState.succeeded, result.reason
    assert ops_of(result.report.graph_code) == ["relu"]
    assert (result.report.nodes_original, result.report.nodes_final) == (2, 1)
    assert result.report.signature == signature


def test_the_repro_of_a_registered_backend_fails_the_same_way(seed: Path, tmp_path: Path) -> None:
    result = minify(seed, spec("relu_compile_error_TESTING_ONLY"), tmp_path / "out")
    assert result.status is JobState.succeeded, result.reason

    repro = tmp_path / "out" / "repro.py"
    text = repro.read_text()
    assert "torch.relu(" in text and "lookup_backend('relu_compile_error_TESTING_ONLY')" in text
    assert "registers 'relu_compile_error_TESTING_ONLY' with torch.compile must be installed" in text
    done = run_repro(repro)
    assert done.returncode != 0
    assert "repro failed with: ReluCompileError" in done.stderr


def test_a_backend_the_worker_does_not_have_fails_the_job_naming_those_it_has(seed: Path, tmp_path: Path) -> None:
    result = minify(seed, spec("no_such_backend_here"), tmp_path / "out")

    assert result.status is JobState.failed
    assert "backend 'no_such_backend_here' is not registered on this worker; it has: " in (result.reason or "")
    assert "relu_compile_error_TESTING_ONLY" in (result.reason or "")


class ViewRelu(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x.view(4, 5)).sum(0)


def test_a_registered_backend_gets_torch_functions_where_torch_has_them() -> None:
    x = torch.randn(20)
    gm = torch.export.export(ViewRelu(), (x,)).graph_module

    swapped = as_torch_functions(gm, [x])

    targets = [node.target for node in swapped.graph.nodes if node.op == "call_function"]
    assert targets == [torch.ops.aten.view.default, torch.relu, torch.sum]  # view is a method: kept
    assert torch.equal(swapped(x)[0], gm(x)[0])
    assert [node.target for node in gm.graph.nodes if node.op == "call_function"][1] is torch.ops.aten.relu.default


class OnesPlusRelu(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + torch.ones(4, 5))


def test_a_factory_op_is_checked_on_meta_tensors_too() -> None:
    x = torch.randn(4, 5)
    gm = torch.export.export(OnesPlusRelu(), (x,)).graph_module

    swapped = as_torch_functions(gm, [x])

    assert [node.target for node in swapped.graph.nodes if node.op == "call_function"] == \
        [torch.ones, torch.add, torch.relu]
    assert torch.equal(swapped(x)[0], gm(x)[0])
