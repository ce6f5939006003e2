"""Minimization strategies: candidate order, validity, and where greedy minimization ends up.

No compiling here. Candidates run in eager on the concrete values of the original program (as
the sandbox would), and "still fails" is a pure-Python oracle: either "the graph contains op X"
or a simulated accuracy bug (a wrong relu / log1p compared against the right one, with torch's
strict or non-strict comparison).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.fx as fx

from examples import programs
from minify_worker.programs.fx import graph as G
from minify_worker.programs.fx import moves as S
from tests.support.graphs import flat_chain, targets_of

Oracle = Callable[[fx.Graph], bool]
ACCURACY = S.StrategyContext(accuracy=True)


@pytest.fixture(autouse=True, scope="module")
def _one_intra_op_thread() -> Iterator[None]:
    """Small eager runs on a shared machine: a second intra-op thread only adds contention (30x)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- helpers: programs, concrete values, eager runs, oracles, a greedy loop ------------------


@functools.cache
def _program(name: str) -> tuple[fx.Graph, dict[str, object]]:
    """The flat graph of an example program and the value of every node (the value store).

    Cached: strategies never mutate the graph they are given."""
    torch.manual_seed(0)
    ep, (args, kwargs) = programs.BUILDERS[name]()
    graph = G.flat_graph_from_exported_program(ep)
    inputs = iter(torch.utils._pytree.tree_leaves((args, kwargs)))
    placeholders = []
    for spec in ep.graph_signature.input_specs:
        if spec.target is None:
            placeholders.append(next(inputs))
        elif spec.target in ep.state_dict:
            placeholders.append(ep.state_dict[spec.target])
        else:
            placeholders.append(ep.constants[spec.target])
    return graph, _concrete_values(graph, placeholders)


def _concrete_values(graph: fx.Graph, args: list[object]) -> dict[str, object]:
    values: dict[str, object] = {}

    class Recorder(fx.Interpreter):
        def run_node(self, node: fx.Node) -> object:
            result = super().run_node(node)
            values[node.name] = result
            return result

    Recorder(G.to_graph_module(graph)).run(*args)
    return values


def _run(graph: fx.Graph, values: dict[str, object], bugs: dict[str, Callable] | None = None) -> tuple:
    """Run `graph` in eager, node by node (as fx.Interpreter, without generating code), inputs
    looked up by minify_value; `bugs` post-process the results of the ops they name."""
    graph.lint()
    bugs = bugs or {}
    env: dict[fx.Node, object] = {}
    for node in graph.nodes:
        if node.op == "placeholder":
            env[node] = values[node.meta[G.META_VALUE]]
        elif node.op == "call_function":
            args, kwargs = fx.node.map_arg((node.args, node.kwargs), env.__getitem__)
            with torch.no_grad():
                result = node.target(*args, **kwargs)
            name = G.target_name(node.target)
            env[node] = bugs[name](result) if name in bugs else result
        else:
            return tuple(fx.node.map_arg(node.args[0], env.__getitem__))
    raise AssertionError("graph without output")


def _contains(op: str) -> Oracle:
    return lambda graph: any(node.op == "call_function" and G.target_name(node.target) == op
                             for node in graph.nodes)


def _accuracy_bug(values: dict[str, object], strict: bool) -> Oracle:
    """Fails iff the compiled (buggy relu and log1p) and eager results differ, as torch compares."""
    bugs = {"aten.relu.default": lambda t: t + 1, "aten.log1p.default": lambda t: t + 1}

    def differs(expected: object, actual: object) -> bool:
        if isinstance(expected, torch.Tensor) and expected.is_floating_point():
            return not torch.allclose(expected, actual, equal_nan=True)
        return strict and not torch.equal(torch.as_tensor(expected), torch.as_tensor(actual))

    def fails(graph: fx.Graph) -> bool:
        pairs = zip(_run(graph, values), _run(graph, values, bugs), strict=True)
        return any(differs(expected, actual) for expected, actual in pairs)

    return fails


def _minimize(graph: fx.Graph, context: S.StrategyContext, fails: Oracle,
              tiers: list[S.Tier] = S.PASSES, checks: list[str] | None = None) -> fx.Graph:
    """The driving rule of the module docstring, sequentially: first failing candidate wins.

    `checks` collects the description of every distinct candidate tested."""
    tested: dict[str, bool] = {}

    def still_fails(candidate: S.Candidate) -> bool:
        key = G.structural_hash(candidate.graph)
        if key not in tested:
            tested[key] = fails(candidate.graph)
            if checks is not None:
                checks.append(candidate.description)
        return tested[key]

    revisit = next(index for index, tier in enumerate(tiers) if not tier.opening)
    tier = 0
    while tier < len(tiers):
        accepted = next((candidate for _, strategy in tiers[tier].strategies
                         for candidate in strategy(graph, context) if still_fails(candidate)), None)
        if accepted is None:
            tier += 1
        else:
            graph = accepted.graph
            tier = tier if tiers[tier].opening else revisit
    return graph


ALL_STRATEGIES = S.OPENING_STRATEGIES + S.DEFAULT_STRATEGIES + S.FINAL_STRATEGIES


def _all_candidates(graph: fx.Graph, context: S.StrategyContext) -> Iterator[S.Candidate]:
    for strategy in ALL_STRATEGIES:
        yield from strategy(graph, context)


def _descriptions(candidates: Iterator[S.Candidate]) -> list[str]:
    return [candidate.description for candidate in candidates]


def _multi_output_graph() -> tuple[fx.Graph, dict[str, object]]:
    """x -> sin, cos, relu, exp, each returned."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    results = [graph.call_function(getattr(torch.ops.aten, name).default, (x,))
               for name in ("sin", "cos", "relu", "exp")]
    graph.output(tuple(results))
    module = fx.GraphModule(torch.nn.Module(), graph)
    ep = torch.export.export(module, (torch.randn(3),))
    flat = G.flat_graph_from_exported_program(ep)
    return flat, _concrete_values(flat, [torch.randn(3)])


# --- order ----------------------------------------------------------------------------------


@pytest.mark.fast
def test_granularities_go_from_the_largest_power_of_two_down_to_one():
    graph, _ = _program("linear_relu_sigmoid")
    assert len(graph.nodes) == 7
    assert S.granularities(graph, S.StrategyContext()) == [4, 2, 1]


@pytest.mark.fast
def test_granularities_respect_the_maximum():
    graph, _ = _program("transformer_layer")
    assert S.granularities(graph, S.StrategyContext(max_granularity=4)) == [4, 2, 1]


@pytest.mark.fast
def test_truncations_cut_at_odd_multiples_of_the_granularity():
    graph = flat_chain(("sin", "relu", "cos", "exp", "tanh", "sigmoid", "neg", "abs"))
    context = S.StrategyContext()
    assert _descriptions(S.truncations_at(graph, context, 2)) == [
        "truncate after relu (granularity 2)", "truncate after sigmoid (granularity 2)"]


@pytest.mark.fast
def test_truncation_and_delta_debugging_alternate_per_granularity_as_in_torch():
    graph, _ = _program("linear_relu_sigmoid")
    assert _descriptions(S.truncate_and_delta_debug(graph, S.StrategyContext())) == [
        "truncate after relu (granularity 4)",
        "promote linear to inputs (granularity 4)",
        "promote relu, sigmoid to inputs (granularity 4)",
        "truncate after linear (granularity 1)",
        "promote relu to inputs (granularity 1)",
    ]


@pytest.mark.fast
def test_output_chunks_are_removed_before_truncation_when_outputs_dominate():
    graph, _ = _multi_output_graph()
    first = next(S.truncate_and_delta_debug(graph, S.StrategyContext()))
    assert first.description == "remove outputs [0, 1]"


def test_no_candidate_repeats_or_equals_its_source():
    graph, _ = _program("transformer_layer")
    for strategy in ALL_STRATEGIES:
        hashes = [G.structural_hash(c.graph) for c in strategy(graph, S.StrategyContext())]
        assert len(hashes) == len(set(hashes))
        assert G.structural_hash(graph) not in hashes


# --- validity -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["transformer_layer", "accuracy_vs_strict", "linear_relu_sigmoid_dict"])
def test_every_candidate_is_smaller_canonical_and_runs_in_eager(name: str):
    graph, values = _program(name)
    for candidate in _all_candidates(graph, S.StrategyContext()):
        assert G.size_key(candidate.graph) < G.size_key(graph), candidate.description
        assert G.misplaced_placeholders(candidate.graph) == 0
        assert all(node.users for node in G.placeholders(candidate.graph))
        _run(candidate.graph, values)


@pytest.mark.fast
def test_candidates_of_a_multi_output_op_run_in_eager():
    graph = fx.Graph()
    x = graph.placeholder("x")
    pair = graph.call_function(torch.ops.aten.max.dim, (x, 1))
    values_node = graph.call_function(operator.getitem, (pair, 0))
    graph.output((graph.call_function(torch.ops.aten.relu.default, (values_node,)),))
    ep = torch.export.export(fx.GraphModule(torch.nn.Module(), graph), (torch.randn(3, 4),))
    flat = G.flat_graph_from_exported_program(ep)
    values = _concrete_values(flat, [torch.randn(3, 4)])
    candidates = list(_all_candidates(flat, S.StrategyContext()))
    assert candidates
    for candidate in candidates:
        _run(candidate.graph, values)


@pytest.mark.fast
def test_structural_strategies_yield_nothing_for_a_clean_graph():
    graph, _ = _program("transformer_layer")
    for strategy in (S.eliminate_dead_code, S.remove_unused_inputs, S.consolidate_inputs):
        assert list(strategy(graph, S.StrategyContext())) == []


@pytest.mark.fast
def test_dead_code_elimination_proposes_the_graph_without_unused_ops():
    graph, _ = _program("relu_cos")
    with_dead_op = G.copy_graph(graph)
    x = G.placeholders(with_dead_op)[0]
    with with_dead_op.inserting_after(x):
        with_dead_op.call_function(torch.ops.aten.exp.default, (x,))
    (candidate,) = S.eliminate_dead_code(with_dead_op, S.StrategyContext())
    assert targets_of(candidate.graph) == ["aten.relu.default", "aten.cos.default"]


@pytest.mark.fast
def test_accuracy_proposes_candidates_whose_outputs_are_booleans():
    graph, _ = _program("accuracy_vs_strict")
    descriptions = _descriptions(S.truncate_suffix(graph, ACCURACY))
    assert "truncate after logical_not_1 (granularity 4)" in descriptions  # compared exactly: it may fail
    assert "truncate after relu (granularity 1)" in descriptions


@pytest.mark.fast
def test_keep_single_output_tries_each_output_alone():
    graph, _ = _multi_output_graph()
    assert _descriptions(S.keep_single_output(graph, S.StrategyContext())) == [
        "keep only output 0 (sin)", "keep only output 1 (cos)", "keep only output 2 (relu)",
        "keep only output 3 (exp)"]


@pytest.mark.fast
def test_one_minimal_proposes_dropping_and_promoting_each_op():
    graph = flat_chain(("sin", "relu"))
    assert _descriptions(S.one_minimal(graph, S.StrategyContext())) == [
        "drop sin (users read x)", "promote sin to an input", "drop relu (users read sin)",
        "promote relu to an input", "cut the chain at relu (its producers become outputs)"]


@pytest.mark.fast
def test_passes_are_the_opening_then_the_default_and_final_tiers():
    assert [tier.names for tier in S.PASSES] == [
        [s.__name__ for s in strategies]
        for strategies in (S.OPENING_STRATEGIES, S.DEFAULT_STRATEGIES, S.FINAL_STRATEGIES)]
    assert [tier.opening for tier in S.PASSES] == [True, False, False]


# --- greedy minimization with a simulated failure --------------------------------------------


@pytest.mark.fast
def test_a_chain_reduces_to_the_failing_op():
    graph = flat_chain(("sin", "cos", "exp", "relu", "tanh", "neg", "abs", "sigmoid"))
    assert targets_of(_minimize(graph, S.StrategyContext(), _contains("aten.relu.default"))) == ["aten.relu.default"]


@pytest.mark.fast
def test_a_transformer_layer_reduces_to_the_failing_op():
    graph, values = _program("transformer_layer")
    result = _minimize(graph, ACCURACY, _accuracy_bug(values, strict=False))
    assert targets_of(result) == ["aten.relu.default"]


@pytest.mark.fast
def test_linear_relu_sigmoid_reduces_to_torchs_aoti_repro():
    graph, _ = _program("linear_relu_sigmoid")
    result = _minimize(graph, S.StrategyContext(), _contains("aten.relu.default"))
    assert G.graph_code(result).splitlines() == [
        "def forward(self, linear):",
        "    relu = torch.ops.aten.relu.default(linear);  linear = None",
        "    return (relu,)",
    ]


@pytest.mark.fast
def test_relu_cos_with_a_relu_bug_reduces_to_relu():
    graph, values = _program("relu_cos")
    result = _minimize(graph, ACCURACY, _accuracy_bug(values, strict=False))
    assert targets_of(result) == ["aten.relu.default"]


@pytest.mark.fast
def test_non_strict_accuracy_localizes_the_bug_that_changes_float_outputs():
    graph, values = _program("accuracy_vs_strict")
    result = _minimize(graph, ACCURACY, _accuracy_bug(values, strict=False))
    assert targets_of(result) == ["aten.relu.default"]


@pytest.mark.fast
def test_strict_accuracy_localizes_the_bug_behind_the_boolean_mask():
    graph, values = _program("accuracy_vs_strict")
    result = _minimize(graph, ACCURACY, _accuracy_bug(values, strict=True))
    assert targets_of(result) == ["aten.log1p.default"]


@pytest.mark.fast
def test_the_final_pass_drops_ops_between_two_that_fail_together():
    graph = flat_chain(("sin", "relu", "cos", "exp"))

    def needs_sin_and_cos(candidate: fx.Graph) -> bool:
        return {"aten.sin.default", "aten.cos.default"} <= set(targets_of(candidate))

    torch_like = _minimize(graph, S.StrategyContext(), needs_sin_and_cos, [S.Tier.of(S.DEFAULT_STRATEGIES)])
    assert targets_of(torch_like) == ["aten.sin.default", "aten.relu.default", "aten.cos.default"]
    ours = _minimize(graph, S.StrategyContext(), needs_sin_and_cos)
    assert targets_of(ours) == ["aten.sin.default", "aten.cos.default"]


class _DynamicReshape(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0] * 2, -1).relu()


@pytest.mark.fast
def test_accuracy_proposes_candidates_that_output_an_int():
    ep = torch.export.export(_DynamicReshape(), (torch.randn(4, 6),),
                             dynamic_shapes={"x": {0: torch.export.Dim("n", min=2)}})
    graph = G.flat_graph_from_exported_program(ep)
    size = next(n.name for n in graph.nodes if n.target is torch.ops.aten.sym_size.int)
    truncate_size = f"truncate after {size} (granularity 1)"
    assert truncate_size in _descriptions(S.truncate_suffix(graph, S.StrategyContext()))
    assert truncate_size in _descriptions(S.truncate_suffix(graph, ACCURACY))  # integers are compared exactly


# --- chain cuts and aiming strategies --------------------------------------------------------


class _GeluChainLayerNorm(torch.nn.Module):
    """gelu -> sum -> mul -> unsqueeze -> layer_norm: two ops joined by a chain no op can bypass."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = (torch.nn.functional.gelu(x).sum(-1) * 2).unsqueeze(-1).expand(-1, 8)
        return torch.nn.functional.layer_norm(y, (8,))


def _needs(*ops: str) -> Oracle:
    return lambda graph: set(ops) <= set(targets_of(graph))


def _cycled_chain(length: int, kinds: tuple[str, ...]) -> fx.Graph:
    return flat_chain(tuple(kinds[index % len(kinds)] for index in range(length)))


EIGHT_KINDS = ("sin", "cos", "exp", "tanh", "sigmoid", "neg", "abs", "relu")


@pytest.mark.fast
def test_a_bug_that_needs_two_ops_joined_by_a_chain_ends_with_the_two_ops():
    ep = torch.export.export(_GeluChainLayerNorm(), (torch.randn(3, 8),))
    graph = G.flat_graph_from_exported_program(ep)
    fails = _needs("aten.gelu.default", "aten.layer_norm.default")

    torch_like = _minimize(graph, S.StrategyContext(), fails,
                           [S.Tier.of(S.DEFAULT_STRATEGIES), S.Tier.of([S.keep_single_output])])
    ours = _minimize(graph, S.StrategyContext(), fails)

    assert len(targets_of(torch_like)) > 2
    assert sorted(targets_of(ours)) == ["aten.gelu.default", "aten.layer_norm.default"]


@pytest.mark.fast
def test_the_result_is_one_minimal_under_every_move_of_the_final_pass():
    ep = torch.export.export(_GeluChainLayerNorm(), (torch.randn(3, 8),))
    fails = _needs("aten.gelu.default", "aten.layer_norm.default")
    result = _minimize(G.flat_graph_from_exported_program(ep), S.StrategyContext(), fails)

    assert not any(fails(candidate.graph) for candidate in S.one_minimal(result, S.StrategyContext()))


def test_a_bug_one_op_kind_triggers_is_found_in_about_log2_n_checks():
    graph = _cycled_chain(256, EIGHT_KINDS)
    checks: list[str] = []

    result = _minimize(graph, S.StrategyContext(), _contains("aten.relu.default"), checks=checks)

    assert targets_of(result) == ["aten.relu.default"]
    assert len(checks) <= 8 + 10, checks


def test_a_bug_one_op_instance_triggers_is_found_by_cuts_by_position():
    graph = _cycled_chain(256, EIGHT_KINDS)
    checks: list[str] = []

    def fails(candidate: fx.Graph) -> bool:
        return any(node.op == "call_function" and node.name == "relu_20" for node in candidate.nodes)

    result = _minimize(graph, S.StrategyContext(), fails, checks=checks)

    assert [node.name for node in result.nodes if node.op == "call_function"] == ["relu_20"]
    # bisect_kinds halves each half of the kinds by position, as bisect_ranges halves the ops.
    assert any(check.startswith("keep ops") or "by position" in check for check in checks)
    assert len(checks) <= 2 * 8 + 10, checks


@pytest.mark.fast
def test_bisect_kinds_halves_the_kinds_by_op_count_then_by_position():
    # sin holds 6 of the 8 ops: the kinds' halves are {sin} and {relu, cos}, each halved by position.
    graph = flat_chain(("sin", "sin", "sin", "relu", "sin", "sin", "sin", "cos"))
    candidates = list(S.bisect_kinds(graph, S.StrategyContext()))
    sin = "aten.sin.default"
    assert [targets_of(candidate.graph) for candidate in candidates] == [
        [sin, sin, sin], [sin, sin, sin], ["aten.relu.default"], ["aten.cos.default"]]


class _ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(4, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # the convolutions in the first half by position
        x = self.second(torch.relu(self.first(x)))
        return torch.sigmoid(x * 2.0 + 1.0).sqrt().cos()


@pytest.mark.fast
@pytest.mark.parametrize("program", ["conv_net", "transformer_layer"])
def test_the_opening_cuts_come_cheapest_compile_first(program: str) -> None:
    """Resnet's first opening cut by graph order held its convolutions: a passing candidate that
    compiled 8 C++ kernels in 11 s while the cut with its pointwise ops, one kernel, failed in 3.
    The first to fail is kept, so its answer is awaited: the cuts with the fewest ops a compiler
    hands to a library (convolutions, matmuls: a kernel each) come first, in bisect_kinds and in
    bisect_ranges; the cuts are the same."""
    if program == "conv_net":
        graph = G.flat_graph_from_exported_program(torch.export.export(_ConvNet(), (torch.randn(1, 3, 8, 8),)))
    else:
        graph, _ = _program(program)
    library = ("aten.conv2d.default", "aten.linear.default", "aten.scaled_dot_product_attention.default")

    cuts = [targets_of(candidate.graph) for candidate in S.bisect_kinds(graph, S.StrategyContext())]
    costs = [sum(1 for target in cut if target in library) for cut in cuts]
    halves = [targets_of(candidate.graph) for candidate in S.bisect_ranges(graph, S.StrategyContext())]
    half_costs = [sum(1 for target in half if target in library) for half in halves]

    assert len(cuts) == 4 and costs == sorted(costs) and costs[0] == 0 < costs[-1], (costs, cuts)
    assert sorted(op for cut in cuts for op in cut if op != "operator.getitem") == \
        sorted(op for op in targets_of(graph) if op != "operator.getitem")
    assert len(halves) == 2 and half_costs == sorted(half_costs), half_costs


@pytest.mark.fast
def test_no_opening_cut_of_a_real_layer_costs_more_than_half_its_ops():
    graph, _ = _program("transformer_layer")
    total = G.count_ops(graph)
    sizes = [G.count_ops(candidate.graph) for candidate in S.bisect_kinds(graph, S.StrategyContext())]
    assert len(sizes) == 4
    assert max(sizes) <= total // 2, (sizes, total)


@pytest.mark.fast
def test_probe_kinds_proposes_one_batch_of_single_op_probes():
    graph = flat_chain(("sin", "relu", "cos", "exp"))
    probes = list(S.probe_kinds(graph, S.StrategyContext(parallelism=3)))
    assert [targets_of(probe.graph) for probe in probes] == [
        ["aten.sin.default"], ["aten.relu.default"], ["aten.cos.default"]]


@pytest.mark.fast
def test_bisect_ranges_keeps_each_half_of_the_ops_in_graph_order():
    graph = flat_chain(("sin", "relu", "cos"))
    assert [targets_of(c.graph) for c in S.bisect_ranges(graph, S.StrategyContext())] == [
        ["aten.sin.default", "aten.relu.default"], ["aten.cos.default"]]


@pytest.mark.fast
def test_aiming_candidates_of_a_real_layer_run_in_eager():
    graph, values = _program("transformer_layer")
    for strategy in S.OPENING_STRATEGIES:
        for candidate in strategy(graph, S.StrategyContext(parallelism=4)):
            _run(candidate.graph, values)


@pytest.mark.fast
def test_an_accuracy_bug_is_localized_by_the_aiming_strategies():
    graph, values = _program("transformer_layer")
    checks: list[str] = []
    result = _minimize(graph, ACCURACY, _accuracy_bug(values, strict=False), checks=checks)
    assert targets_of(result) == ["aten.relu.default"]
    assert checks[0].startswith("keep the ops of kinds")
