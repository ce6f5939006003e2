"""Programs with control flow (higher-order ops with subgraphs) through the engine.

A higher-order op (`torch.cond`, `while_loop`) is one op of its graph; its subgraphs travel with it
into every candidate, `minimized.pt2` and repro.py. A bug inside a branch ends inlined when it does
not need the control flow, and inside the kept op, its subgraphs minimized, when it does. The test
backends (tests/support/backends.py) fail on relu anywhere, or only on relu inside a subgraph.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch._higher_order_ops.map import map as map_hop
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop

from minify_contract.models import JobSpec, JobState
from minify_worker.engine import MinifyResult, minify
from minify_worker.programs.fx import graph as G
from minify_worker.programs.fx import moves
from minify_worker.programs.fx.prepare import prepare
from minify_worker.programs.prepared import PreparedProgram
from tests.support.backends import PREFIX
from tests.support.graphs import ops_of, targets_of
from tests.support.repro import Repros

pytestmark = pytest.mark.usefixtures("test_backends_allowed")


class ReluInCondBranch(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        def taken(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch.relu(a).mul(b).add(a.cos())

        def other(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return a.sub(b).exp()

        a = x.sin()
        return torch.cond(a.sum() > 0, taken, other, (a, y)).tanh()


class ReluInLoopBody(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def more(i: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
            return i < 3

        def body(i: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return i + 1, torch.relu(value.cos()).sub(0.5)

        count, value = while_loop(more, body, (torch.zeros((), dtype=torch.int64), x.sin()))
        return count, value.exp()


class ReluInScoreMod(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        from torch.nn.attention.flex_attention import flex_attention

        def score_mod(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_index: torch.Tensor,
                      kv_index: torch.Tensor) -> torch.Tensor:
            return torch.relu(score) + (q_index - kv_index)

        return flex_attention(q.sin(), k, v, score_mod=score_mod).cos()


def save(tmp_path: Path, module: torch.nn.Module, *inputs: torch.Tensor) -> Path:
    path = tmp_path / "program.pt2"
    torch.export.save(torch.export.export(module, inputs), path)
    return path


@pytest.fixture(scope="module")
def cond_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ReluInCondBranch exported and saved once for the module's three jobs on it (a job only reads
    its program)."""
    return save(tmp_path_factory.mktemp("cond"), ReluInCondBranch(), torch.ones(4, 8),
                torch.randn(4, 8))  # sin(1) > 0: taken


@pytest.fixture(scope="module")
def loop_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ReluInLoopBody exported and saved once for the module's two jobs on it."""
    return save(tmp_path_factory.mktemp("loop"), ReluInLoopBody(), torch.randn(4, 8))


def run(program: Path, backend: str, out: Path, **config: str) -> MinifyResult:
    spec = JobSpec.model_validate({
        "backend": backend,
        "config": config,
        "limits": {"candidate_timeout_s": 60, "parallelism": 2},
        # About the reduction of control flow: the phases after minimality (the culprit, the inputs'
        # shrink: under inductor, a compile per halving; the versions' repro runs) have their own tests.
        "culprit": False,
        "shrink": False,
        "versions": False,
    })
    return minify(program, spec, out)


@pytest.fixture(scope="module")
def repros() -> Repros:
    """The module's repro.py runs, each as `python repro.py` in a fork of the test process's one
    interpreter that ran their first imports (tests/support/repro.py), instead of one interpreter
    importing torch per repro."""
    return Repros()


def assert_artifacts_reproduce(out: Path, signature: str, repros: Repros) -> None:
    """minimized.pt2 loads and runs on inputs.pt; repro.py fails the same way in a fresh process
    (a fork of an interpreter that imported torch and nothing else)."""
    module = torch.export.load(out / "minimized.pt2").module()
    module(*torch.load(out / "inputs.pt", weights_only=True))
    done = repros.run(out / "repro.py")
    assert done.returncode == 1, done.stderr[-3000:]
    assert f"repro failed with: {signature}" in done.stderr, done.stderr[-3000:]


# --- the program form: subgraphs travel with their op ---------------------------------------


def test_subgraphs_travel_on_the_wire_count_as_ops_and_enter_the_hash() -> None:
    graph = G.flat_graph_from_exported_program(
        torch.export.export(ReluInCondBranch(), (torch.ones(4, 8), torch.randn(4, 8))))
    back = G.graph_from_wire(json.loads(json.dumps(G.graph_to_wire(graph))))
    branch = next(node for node in G.subgraphs(graph) if node.target == "true_graph_0")
    smaller = G.drop_in_subgraph(G.subgraph_of(branch), "mul")
    assert smaller is not None
    other_branch = G.with_subgraph(graph, branch.name, smaller)

    assert G.structural_hash(back) == G.structural_hash(graph)
    assert G.count_ops(graph) == 12 and G.count_ops(other_branch) == 11
    assert G.structural_hash(other_branch) != G.structural_hash(graph)
    assert "# true_graph_0:" in G.graph_code(back)


def test_a_cond_inlines_its_branch_with_the_branch_values_kept_promotable() -> None:
    graph = G.flat_graph_from_exported_program(
        torch.export.export(ReluInCondBranch(), (torch.ones(4, 8), torch.randn(4, 8))))
    branch = G.subgraph_of(next(node for node in G.subgraphs(graph) if node.target == "true_graph_0"))
    for node in branch.nodes:  # as the loader marks the branch the original run took
        if node.op == "call_function":
            node.meta[G.META_VALUE] = f"cond/{node.name}"

    inlined = G.inline_subgraph(graph, "cond", "true_graph_0")

    assert inlined is not None
    assert [node.name for node in inlined.nodes if node.op == "call_function"] == [
        "sin", "relu", "mul", "cos", "add", "tanh"]
    assert G.is_promotable(next(node for node in inlined.nodes if node.name == "relu"))


class NestedConds(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        def inner_taken(a: torch.Tensor) -> torch.Tensor:
            return torch.relu(a) * 2

        def inner_other(a: torch.Tensor) -> torch.Tensor:
            return a + 1

        def taken(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch.cond(b.sum() < 100, inner_taken, inner_other, (a.cos(),)) + b

        def other(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return a - b

        return torch.cond(x.sum() > 0, taken, other, (x, y)).tanh()


def test_the_loader_records_the_values_of_the_branches_taken_nested_ones_included(tmp_path: Path) -> None:
    program = save(tmp_path, NestedConds(), torch.ones(4), torch.randn(4))
    prepare(program, None, tmp_path / "work")
    prepared = PreparedProgram.read(tmp_path / "work")
    graph = G.graph_from_wire(prepared.wire_graph)
    values = torch.load(prepared.values_path, weights_only=True)

    outer = G.inline_subgraph(graph, "cond", "true_graph_0")
    assert outer is not None
    inner = next(node for node in outer.nodes if node.op == "call_function"
                 and G.target_name(node.target) == "higher_order.cond")
    inlined = G.inline_subgraph(outer, inner.name, G.inlinable_subgraphs(outer, inner.name)[0])
    assert inlined is not None

    assert {"cond/cos", "cond/cond/relu", "cond/cond/mul"} <= set(values)
    assert graph.find_nodes(op="call_function", target=torch.ops.higher_order.cond)[0].meta[G.META_TAKEN] == 1
    assert {node.name: node.meta.get(G.META_VALUE) for node in inlined.nodes if node.op == "call_function"} == {
        "cos": "cond/cos", "relu": "cond/cond/relu", "mul": "cond/cond/mul", "add": "cond/add", "tanh": "tanh"}
    (result,) = G.to_graph_module(inlined)(values["x"], values["y"])
    torch.testing.assert_close(result, values["tanh"])


class ReluInScan(torch.nn.Module):
    def forward(self, init: torch.Tensor, xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def step(carry: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            new = torch.relu(carry + x)
            return new, new * 2

        return scan(step, init, xs)


class ReluInMap(torch.nn.Module):
    def forward(self, xs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return map_hop(lambda x, b: torch.relu(x) + b, xs, y)


@pytest.mark.parametrize(("module", "inputs", "op"), [
    (ReluInScan(), (torch.randn(3), torch.randn(5, 3)), "higher_order.scan"),
    (ReluInMap(), (torch.randn(5, 3), torch.randn(3)), "higher_order.map_impl"),
], ids=["scan", "map"])
def test_scan_and_map_run_from_the_wire_as_one_op(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
                                                  op: str) -> None:
    program = torch.export.export(module, inputs)
    graph = G.graph_from_wire(json.loads(json.dumps(G.graph_to_wire(G.flat_graph_from_exported_program(program)))))

    results = G.to_graph_module(graph)(*inputs)

    expected = program.module()(*inputs)
    torch.testing.assert_close(list(results), list(expected) if isinstance(expected, tuple) else [expected])
    assert [name for name in targets_of(graph) if name.startswith("higher_order.")] == [op]


def test_flex_attention_runs_from_the_wire_and_its_score_mod_is_minimized() -> None:
    # Decomposed: flex attention's block mask is built under vmap, whose calls are not aten ops.
    # (torch.export.save cannot serialize flex_attention in torch 2.13: its engine test takes program.json,
    # tests/client/capture/test_capture_wire.py.)
    inputs = tuple(torch.randn(1, 2, 16, 8) for _ in range(3))
    program = torch.export.export(ReluInScoreMod(), inputs).run_decompositions()
    graph = G.graph_from_wire(G.graph_to_wire(G.flat_graph_from_exported_program(program)))

    (result,) = G.to_graph_module(graph)(*inputs)

    torch.testing.assert_close(result, program.module()(*inputs))
    descriptions = [candidate.description
                    for candidate in moves.simplify_subgraphs(graph, moves.StrategyContext())]
    assert "drop add in sdpa_score0" in descriptions


# --- through the engine ------------------------------------------------------------------------


def test_a_bug_in_a_cond_branch_ends_inlined_as_the_op(tmp_path: Path, cond_program: Path, repros: Repros) -> None:
    result = run(cond_program, f"{PREFIX}:fail_on_relu_anywhere", tmp_path / "out")

    assert result.status is JobState.succeeded, result.reason
    code = result.report.graph_code or ""
    assert ops_of(code) == ["relu"] and "higher_order" not in code
    # sin, sum, gt, cond, getitem, tanh; relu, mul, cos, add in one branch; sub, exp in the other
    assert result.report.nodes_original == 12 and result.report.nodes_final == 1
    assert_artifacts_reproduce(tmp_path / "out", "RuntimeError: injected failure on relu", repros)


def test_a_bug_that_needs_the_cond_keeps_it_and_minimizes_its_branches(
        tmp_path: Path, cond_program: Path, repros: Repros) -> None:
    result = run(cond_program, f"{PREFIX}:fail_on_relu_in_subgraph", tmp_path / "out")

    assert result.status is JobState.succeeded, result.reason
    code = result.report.graph_code or ""
    assert "torch.ops.higher_order.cond" in code
    assert ops_of(code) == ["relu"]  # alone in its branch; the predicate became an input
    assert_artifacts_reproduce(tmp_path / "out", "RuntimeError: injected failure on relu in a subgraph", repros)


def test_a_bug_in_a_while_loop_body_ends_as_the_op(tmp_path: Path, loop_program: Path, repros: Repros) -> None:
    result = run(loop_program, f"{PREFIX}:fail_on_relu_anywhere", tmp_path / "out")

    assert result.status is JobState.succeeded, result.reason
    code = result.report.graph_code or ""
    assert ops_of(code) == ["relu"] and "higher_order" not in code
    assert_artifacts_reproduce(tmp_path / "out", "RuntimeError: injected failure on relu", repros)


def test_a_bug_that_needs_the_while_loop_keeps_it(tmp_path: Path, loop_program: Path, repros: Repros) -> None:
    result = run(loop_program, f"{PREFIX}:fail_on_relu_in_subgraph", tmp_path / "out")

    assert result.status is JobState.succeeded, result.reason
    code = result.report.graph_code or ""
    assert "torch.ops.higher_order.while_loop" in code
    # The condition and the counter that moves the loop on stay; the body is relu besides.
    assert sorted(ops_of(code)) == ["add", "lt", "relu"]
    assert_artifacts_reproduce(tmp_path / "out", "RuntimeError: injected failure on relu in a subgraph", repros)


@pytest.mark.inductor
def test_inductors_relu_bug_inside_a_cond_branch_ends_as_relu(
        tmp_path: Path, cond_program: Path, repros: Repros) -> None:
    result = run(cond_program, "inductor", tmp_path / "out",
                 **{"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"})

    assert result.status is JobState.succeeded, result.reason
    code = result.report.graph_code or ""
    assert ops_of(code) == ["relu"] and "higher_order" not in code
    signature = result.report.signature or ""
    assert signature.startswith("CppCompileError")
    assert_artifacts_reproduce(tmp_path / "out", signature, repros)
