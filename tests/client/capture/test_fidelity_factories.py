"""repro.py compiles the graph minify tested, input-free ops included (issue 38, pytorch#183988).

An op none of whose arguments is an input (a factory: `randperm(8)`, `arange(0, 8)`, `full`,
`rand`) is a node of the minimal graph, and the worker compiles it as one. repro.py traced its
`Repro` module with plain `torch.fx.symbolic_trace`, which runs such an op once while tracing and
puts its result in the graph as a constant tensor: #183988's pattern of `index(x, randperm(n))`
was gone, and its repro failed with an 'index out of bounds' kernel error instead of the pattern
matcher's. repro.py now traces with a tracer that records every op (`trace_repro`).

The family: four programs whose failure needs a factory op in the graph (randperm, arange, full,
rand), each captured from a real `torch.compile`, minimized by the offline engine and its repro.py
run in a fresh process. The backend is cheap: eager, but it fails to compile a graph holding a call
of one of those ops with no input, naming the op (tests/support/fidelity_backends.py).
"""

from __future__ import annotations

import importlib

import pytest
import torch
from torch import fx

from minify_client.capture import capture_failures
from minify_contract.models import JobSpec, JobState
from minify_worker.engine import MinifyResult, minify
from minify_worker.programs.fx.backends import ALLOWED_BACKENDS_ENV
from tests.support.repro import Repros

# The backend (`fail_on_an_input_free_factory`) by the name a capture records and sandbox children and
# repro.py import: a module of torch alone, which each repro.py imports again.
BACKENDS = "tests.support.fidelity_backends"


def shuffled_rows(x: torch.Tensor) -> torch.Tensor:
    return x[torch.randperm(x.shape[0])]


def column_ramp(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x) + torch.arange(x.shape[-1])


def doubled(x: torch.Tensor) -> torch.Tensor:
    return torch.cos(x) * torch.full(x.shape, 2.0)


def jittered(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) + torch.rand(x.shape)


FAMILY = {"randperm": shuffled_rows, "arange": column_ramp, "full": doubled, "rand": jittered}


@pytest.fixture(scope="module")
def minimized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, MinifyResult]:
    """Every program of the family compiled on an (8, 4) input, captured and minimized."""
    backend = importlib.import_module(BACKENDS).fail_on_an_input_free_factory
    results = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ALLOWED_BACKENDS_ENV, BACKENDS)
        for op, function in FAMILY.items():
            directory = tmp_path_factory.mktemp(op)
            torch._dynamo.reset()
            x = torch.randn(8, 4)
            with pytest.raises(Exception, match=f"injected failure on an input-free {op}"), capture_failures(
                    torch.nn.Identity(), (x,), save_to=directory, name="program"):
                torch.compile(function, backend=backend)(x)
            captured = directory / "program.pt2"
            spec = JobSpec.model_validate_json((directory / "spec.json").read_text())
            spec = spec.model_copy(update={"limits": spec.limits.model_copy(update={"parallelism": 2}),
                                           "culprit": False, "versions": False, "shrink": False})
            results[op] = minify(captured, spec, directory / "out", inputs=directory / "inputs.pt")
    return results


@pytest.fixture(scope="module")
def repros() -> Repros:
    """The module's repro.py runs, each as `python repro.py` in a fork of the test process's one
    interpreter that ran their first imports (tests/support/repro.py), instead of one interpreter
    importing torch per repro."""
    return Repros()


@pytest.mark.parametrize("op", FAMILY)
def test_the_minimal_graph_keeps_the_factory_op(op: str, minimized: dict[str, MinifyResult]) -> None:
    result = minimized[op]

    assert result.status is JobState.succeeded, result.reason
    assert result.report.signature == f"RuntimeError: injected failure on an input-free {op}"
    assert f"torch.ops.aten.{op}." in (result.report.graph_code or "")


@pytest.mark.parametrize("op", FAMILY)
def test_its_repro_keeps_the_factory_an_op_and_fails_the_same_way(
        op: str, minimized: dict[str, MinifyResult], repros: Repros) -> None:
    repro = minimized[op].artifacts["repro.py"]
    done = repros.run(repro)

    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert f"repro failed with: RuntimeError: injected failure on an input-free {op}" in done.stderr
    assert "def trace_repro(" in repro.read_text()


def test_a_repro_without_input_free_ops_keeps_plain_symbolic_trace() -> None:
    """Only what needs it gets the recording tracer: a graph whose every op reads an input reads
    as before."""
    from minify_worker.programs.fx.repro import render_repro

    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output((graph.call_function(torch.ops.aten.relu.default, (x,)),))
    spec = JobSpec(backend=f"{BACKENDS}:fail_on_an_input_free_factory")
    text = render_repro(graph, spec, None, torch.__version__, inputs=[torch.zeros(2)])

    assert "gm = torch.fx.symbolic_trace(Repro())" in text and "trace_repro" not in text
