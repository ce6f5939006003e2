"""Graph surgery on flat fx graphs: wire form, hashing, and each pure surgery primitive."""

from __future__ import annotations

import json
import math
import operator

import pytest
import torch
import torch.fx as fx

from examples import programs
from minify_worker.programs.fx import graph as G
from tests.support.graphs import targets_of

pytestmark = pytest.mark.fast


def _flat(builder_name: str) -> fx.Graph:
    ep, _ = programs.BUILDERS[builder_name]()
    return G.flat_graph_from_exported_program(ep)


def _round_trip(graph: fx.Graph) -> fx.Graph:
    return G.graph_from_wire(json.loads(json.dumps(G.graph_to_wire(graph), allow_nan=False)))


def _names(graph: fx.Graph, op: str) -> list[str]:
    return [node.name for node in graph.nodes if node.op == op]


def _max_dim_graph() -> fx.Graph:
    """x -> aten.max.dim (tuple) -> getitem 0 / 1 -> values.to(float64), indices."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta.update({G.META_VALUE: "x", G.META_KIND: "tensor", G.META_ROLE: "input",
                   G.META_TENSOR: {"shape": [3, 4], "dtype": "float32", "device": "cpu",
                                   "stride": [4, 1]}})
    pair = graph.call_function(torch.ops.aten.max.dim, (x, 1), {"keepdim": False})
    pair.meta[G.META_KIND] = "tuple"
    values = graph.call_function(operator.getitem, (pair, 0))
    indices = graph.call_function(operator.getitem, (pair, 1))
    for node, dtype in ((values, "float32"), (indices, "int64")):
        node.meta.update({G.META_VALUE: node.name, G.META_KIND: "tensor",
                          G.META_TENSOR: {"shape": [3], "dtype": dtype, "device": "cpu",
                                          "stride": [1]}})
    wide = graph.call_function(torch.ops.aten._to_copy.default, (values,),
                               {"dtype": torch.float64, "layout": torch.strided,
                                "device": torch.device("cpu"),
                                "memory_format": torch.preserve_format})
    wide.meta.update({G.META_VALUE: wide.name, G.META_KIND: "tensor"})
    graph.output((wide, indices, None)).meta[G.META_KIND] = "other"
    return graph


# --- from an ExportedProgram ----------------------------------------------------------------


def test_flat_graph_keeps_only_minify_meta():
    graph = _flat("linear_relu_sigmoid")
    for node in graph.nodes:
        assert set(node.meta) <= {G.META_VALUE, G.META_KIND, G.META_TENSOR, G.META_ROLE}


def test_flat_graph_describes_tensors_from_their_fake_values():
    relu = next(n for n in _flat("linear_relu_sigmoid").nodes if n.name == "relu")
    assert relu.meta[G.META_VALUE] == "relu"
    assert relu.meta[G.META_KIND] == "tensor"
    assert relu.meta[G.META_TENSOR] == {"shape": [8, 16], "dtype": "float32", "device": "cpu",
                                        "stride": [16, 1]}


def test_flat_graph_marks_parameter_and_input_roles():
    roles = {n.name: n.meta[G.META_ROLE] for n in _flat("linear_relu_sigmoid").nodes
             if n.op == "placeholder"}
    assert roles == {"p_fc1_weight": "parameter", "p_fc1_bias": "parameter", "x": "input"}


def test_flat_graph_is_a_copy():
    ep, _ = programs.relu_cos()
    graph = G.flat_graph_from_exported_program(ep)
    assert graph is not ep.graph_module.graph
    assert "val" in next(iter(ep.graph_module.graph.nodes)).meta


def test_flat_graph_runs_like_the_program():
    ep, (args, _) = programs.linear_relu_sigmoid()
    graph = G.flat_graph_from_exported_program(ep)
    weights = [ep.state_dict["fc1.weight"], ep.state_dict["fc1.bias"]]
    (result,) = G.to_graph_module(graph)(*weights, *args)
    torch.testing.assert_close(result, ep.module()(*args))


# --- wire form ------------------------------------------------------------------------------


def test_wire_round_trip_keeps_names_targets_and_meta():
    graph = _flat("transformer_layer")
    back = _round_trip(graph)
    assert [n.name for n in back.nodes] == [n.name for n in graph.nodes]
    assert targets_of(back) == targets_of(graph)
    assert [n.meta for n in back.nodes] == [n.meta for n in graph.nodes]


def test_wire_round_trip_keeps_multi_output_ops_and_typed_kwargs():
    graph = _max_dim_graph()
    back = _round_trip(graph)
    assert G.graph_code(back) == G.graph_code(graph)
    wide = next(n for n in back.nodes if n.target is torch.ops.aten._to_copy.default)
    assert wide.kwargs == {"dtype": torch.float64, "layout": torch.strided,
                           "device": torch.device("cpu"), "memory_format": torch.preserve_format}
    assert G.outputs(back)[2] is None


def test_wire_round_trip_keeps_special_floats_slices_and_containers():
    graph = fx.Graph()
    x = graph.placeholder("x")
    clamp = graph.call_function(torch.ops.aten.clamp.default, (x, -math.inf, math.inf))
    pad = graph.call_function(operator.getitem, (x, (slice(None, 2, None), Ellipsis)))
    nan = graph.call_function(torch.ops.aten.fill.Scalar, (x, math.nan))
    stack = graph.call_function(torch.ops.aten.stack.default, ([clamp, nan],), {"dim": 0})
    graph.output((stack, pad))
    back = _round_trip(graph)
    args = [n.args for n in back.nodes if n.op == "call_function"]
    assert args[0][1:] == (-math.inf, math.inf)
    assert args[1][1] == (slice(None, 2, None), Ellipsis)
    assert math.isnan(args[2][1])
    assert isinstance(args[3][0], list) and [n.name for n in args[3][0]] == ["clamp_default", "fill_scalar"]


def test_wire_form_refuses_unknown_target_names():
    wire = G.graph_to_wire(_flat("relu_cos"))
    wire["nodes"][1]["target"] = "os.system"
    with pytest.raises(G.GraphFormatError, match=r"os\.system"):
        G.graph_from_wire(wire)


def test_wire_form_refuses_python_callables_outside_the_allowlist():
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output((graph.call_function(print, (x,)),))
    with pytest.raises(G.GraphFormatError, match="print"):
        G.graph_to_wire(graph)


def test_wire_form_resolves_other_operator_namespaces():
    assert G.resolve_target("prims.add.default") is torch.ops.prims.add.default
    assert G.resolve_target("aten.relu") is torch.ops.aten.relu
    assert G.resolve_target("math.sqrt") is math.sqrt


def test_wire_form_refuses_non_operator_attributes_of_torch_ops():
    with pytest.raises(G.GraphFormatError):
        G.resolve_target("aten.relu.__class__")


# --- identity -------------------------------------------------------------------------------


def _renamed(graph: fx.Graph) -> fx.Graph:
    wire = G.graph_to_wire(graph)
    rename = {e["name"]: f"n{i}" for i, e in enumerate(wire["nodes"]) if e["op"] != "output"}
    text = json.dumps(wire)
    for old, new in sorted(rename.items(), key=lambda item: -len(item[0])):
        text = text.replace(f'"{old}"', f'"{new}"')
    renamed = json.loads(text)
    for entry, original in zip(renamed["nodes"], wire["nodes"], strict=True):
        entry["meta"] = original.get("meta", {})
    return G.graph_from_wire(renamed)


def test_structural_hash_ignores_node_names():
    graph = _flat("transformer_layer")
    renamed = _renamed(graph)
    assert _names(renamed, "call_function") != _names(graph, "call_function")
    assert G.structural_hash(renamed) == G.structural_hash(graph)


def test_structural_hash_sees_a_changed_target():
    graph = _flat("relu_cos")
    changed = G.copy_graph(graph)
    next(n for n in changed.nodes if n.name == "cos").target = torch.ops.aten.sin.default
    assert G.structural_hash(changed) != G.structural_hash(graph)


def test_structural_hash_sees_a_changed_constant():
    graph = _flat("accuracy_vs_strict")
    changed = G.copy_graph(graph)
    gt = next(n for n in changed.nodes if n.name == "gt")
    gt.args = (gt.args[0], 1)
    assert G.structural_hash(changed) != G.structural_hash(graph)


def test_structural_hash_sees_which_value_an_input_holds():
    graph = G.canonicalize(G.promote_to_inputs(_flat("relu_cos"), ["relu"]))
    changed = G.copy_graph(graph)
    G.placeholders(changed)[0].meta[G.META_VALUE] = "x"
    assert G.structural_hash(changed) != G.structural_hash(graph)


def test_count_ops_counts_call_functions():
    assert G.count_ops(_flat("linear_relu_sigmoid")) == 3
    assert G.count_ops(_max_dim_graph()) == 4


def test_graph_code_is_readable_python():
    code = G.graph_code(_flat("relu_cos"))
    assert code.startswith("def forward(self, x):")
    assert "torch.ops.aten.relu.default(x)" in code


# --- surgery --------------------------------------------------------------------------------


def test_surgery_leaves_its_argument_untouched():
    graph = _flat("linear_relu_sigmoid")
    before = G.graph_code(graph)
    G.truncate_after(graph, "relu")
    G.promote_to_inputs(graph, ["linear"])
    G.drop_node(graph, "relu")
    G.prune_outputs(graph, [0])
    assert G.graph_code(graph) == before


def test_truncate_after_outputs_that_node_and_drops_the_rest():
    graph = G.truncate_after(_flat("linear_relu_sigmoid"), "relu")
    assert targets_of(graph) == ["aten.linear.default", "aten.relu.default"]
    assert [n.name for n in G.outputs(graph)] == ["relu"]
    graph.lint()


def test_truncate_after_removes_code_the_cut_node_does_not_need():
    graph = G.truncate_after(_flat("accuracy_vs_strict"), "relu")
    assert targets_of(graph) == ["aten.relu.default"]


def test_promote_to_inputs_keeps_the_node_name_and_value():
    graph = G.promote_to_inputs(_flat("linear_relu_sigmoid"), ["linear"])
    linear = next(n for n in graph.nodes if n.name == "linear")
    assert linear.op == "placeholder" and linear.target == "linear"
    assert linear.meta[G.META_VALUE] == "linear"
    assert linear.meta[G.META_ROLE] == "promoted"
    assert linear.meta[G.META_TENSOR]["shape"] == [8, 16]


def test_promote_then_canonicalize_gives_torchs_aoti_repro_shape():
    graph = G.canonicalize(G.promote_to_inputs(G.truncate_after(_flat("linear_relu_sigmoid"),
                                                                "relu"), ["linear"]))
    assert G.graph_code(graph).splitlines()[0] == "def forward(self, linear):"
    assert targets_of(graph) == ["aten.relu.default"]


def test_promoting_a_tuple_node_promotes_its_getitems():
    source = _max_dim_graph()
    pair = next(n for n in source.nodes if n.target is torch.ops.aten.max.dim)
    graph = G.promote_to_inputs(source, [pair.name])
    assert _names(G.canonicalize(graph), "placeholder") == ["getitem", "getitem_1"]
    assert targets_of(G.canonicalize(graph)) == ["aten._to_copy.default"]


def test_promote_refuses_nodes_without_a_stored_value():
    graph = _flat("relu_cos")
    with pytest.raises(ValueError):
        G.promote_to_inputs(graph, ["x"])


def test_eliminate_dead_code_drops_unused_ops_but_not_mutations():
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.call_function(torch.ops.aten.relu.default, (x,))
    graph.call_function(torch.ops.aten._assert_async.msg, (x, "boom"))
    graph.call_function(torch.ops.aten.add_.Tensor, (x, x))
    graph.output((x,))
    assert targets_of(G.eliminate_dead_code(graph)) == ["aten.add_.Tensor"]


def test_remove_unused_inputs_keeps_used_inputs_in_order():
    graph = G.eliminate_dead_code(G.promote_to_inputs(_flat("linear_relu_sigmoid"), ["linear"]))
    assert _names(G.remove_unused_inputs(graph), "placeholder") == ["linear"]


def test_consolidate_inputs_moves_placeholders_first_in_order():
    graph = G.promote_to_inputs(_flat("accuracy_vs_strict"), ["logical_not_1", "log1p"])
    consolidated = G.consolidate_inputs(graph)
    assert G.misplaced_placeholders(graph) == 1
    assert _names(consolidated, "placeholder") == ["x", "log1p", "logical_not_1"]
    assert G.misplaced_placeholders(consolidated) == 0
    consolidated.lint()


def test_remove_outputs_drops_positions():
    graph = G.remove_outputs(_max_dim_graph(), [0, 2])
    assert [n.name for n in G.outputs(graph)] == ["getitem_1"]


def test_prune_outputs_keeps_one_and_removes_what_it_no_longer_needs():
    graph = G.prune_outputs(_max_dim_graph(), [1])
    assert targets_of(graph) == ["aten.max.dim", "operator.getitem"]


def test_drop_node_wires_users_to_a_same_typed_input():
    graph = G.drop_node(_flat("relu_cos"), "relu")
    assert graph is not None
    assert G.graph_code(graph).splitlines()[1].strip().startswith(
        "cos = torch.ops.aten.cos.default(x)")


def test_drop_node_refuses_when_no_input_has_the_same_type():
    assert G.drop_node(_flat("linear_relu_sigmoid"), "linear") is None


def test_size_key_orders_ops_then_outputs_then_inputs():
    graph = _flat("linear_relu_sigmoid")
    assert G.size_key(graph) == (3, 1, 3, 0)
    assert G.size_key(G.canonicalize(G.promote_to_inputs(graph, ["linear"]))) < G.size_key(graph)


# --- derive: the fused primitives strategies use ---------------------------------------------


def _hash(graph: fx.Graph) -> str:
    return G.structural_hash(graph)


def test_derive_cut_equals_canonical_truncation():
    graph = _flat("transformer_layer")
    for node in [n for n in graph.nodes if n.op == "call_function"]:
        assert _hash(G.derive(graph, cut=node.name)) == _hash(G.canonicalize(G.truncate_after(graph, node.name)))


def test_derive_promote_equals_canonical_promotion():
    graph = _flat("transformer_layer")
    body = [n.name for n in graph.nodes if n.op == "call_function"]
    for chunk in (body[:1], body[3:9], body[10:30:3]):
        targets = G.promotion_targets(graph, chunk)
        assert _hash(G.derive(graph, promote=targets)) == _hash(G.canonicalize(G.promote_to_inputs(graph, chunk)))


def test_derive_bypass_equals_canonical_drop():
    graph = _flat("transformer_layer")
    for node in [n for n in graph.nodes if n.op == "call_function"]:
        stand_in = G.stand_in_for(graph, node.name)
        if stand_in is not None:
            expected = G.canonicalize(G.drop_node(graph, node.name))
            assert _hash(G.derive(graph, bypass={node.name: stand_in})) == _hash(expected)


def test_derive_keep_outputs_equals_canonical_pruning():
    graph = _max_dim_graph()
    assert _hash(G.derive(graph, keep_outputs=[1])) == _hash(G.canonicalize(G.prune_outputs(graph, [1])))


def test_derive_gives_promoted_inputs_their_role():
    graph = G.derive(_flat("linear_relu_sigmoid"), cut="relu", promote=["linear"])
    assert [(n.name, n.meta[G.META_ROLE]) for n in G.placeholders(graph)] == [("linear", "promoted")]


# --- programs with constants and dynamic shapes ----------------------------------------------


class _ConstantPlusRelu(torch.nn.Module):
    """The seed's test_constant_in_graph program."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tensor(2) + torch.relu(x)


class _DynamicReshape(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0] * 2, -1).relu()


def _dynamic_graph() -> fx.Graph:
    ep = torch.export.export(_DynamicReshape(), (torch.randn(4, 6),),
                             dynamic_shapes={"x": {0: torch.export.Dim("n", min=2)}})
    return G.flat_graph_from_exported_program(ep)


def test_flat_graph_marks_lifted_constants():
    ep = torch.export.export(_ConstantPlusRelu(), (torch.randn(2),))
    roles = [n.meta[G.META_ROLE] for n in G.placeholders(G.flat_graph_from_exported_program(ep))]
    assert roles == ["constant", "input"]


def test_flat_graph_gives_symbolic_sizes_their_example_value():
    x = G.placeholders(_dynamic_graph())[0]
    assert x.meta[G.META_TENSOR]["shape"] == [4, 6]


def test_flat_graph_makes_symbolic_scalars_promotable_ints():
    sizes = [n for n in _dynamic_graph().nodes if n.target is torch.ops.aten.sym_size.int]
    assert sizes and all(G.is_promotable(n) and n.meta[G.META_SCALAR] == "int" for n in sizes)


def test_wire_round_trip_keeps_symbolic_arithmetic():
    graph = _dynamic_graph()
    back = _round_trip(graph)
    assert "operator.mul" in targets_of(back)
    assert G.structural_hash(back) == G.structural_hash(graph)


def test_structural_hash_tells_an_int_constant_from_a_float_one():
    graph = _flat("accuracy_vs_strict")
    changed = G.copy_graph(graph)
    gt = next(n for n in changed.nodes if n.name == "gt")
    assert gt.args[1] == 0 and isinstance(gt.args[1], int)
    gt.args = (gt.args[0], 0.0)
    assert G.structural_hash(changed) != G.structural_hash(graph)


# --- extraction and chain cuts ----------------------------------------------------------------


class _SinSumMulRelu(torch.nn.Module):
    """sin -> sum(-1) -> mul -> relu: a chain whose middle changes shape (no op can stand in)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.sin(x).sum(-1) * 2)


def _sin_sum_mul_relu() -> fx.Graph:
    return G.flat_graph_from_exported_program(torch.export.export(_SinSumMulRelu(), (torch.randn(3, 4),)))


def test_cut_chain_promotes_the_node_and_keeps_its_producer_as_an_output():
    graph = _sin_sum_mul_relu()
    cut = G.cut_chain(graph, "sum_1")
    assert cut is not None
    assert targets_of(cut) == ["aten.sin.default", "aten.mul.Tensor", "aten.relu.default"]
    assert _names(cut, "placeholder") == ["x", "sum_1"]
    assert [value.name for value in G.outputs(cut)] == ["relu", "sin"]


def test_cut_chain_is_none_when_the_producer_survives_plain_promotion():
    graph = _sin_sum_mul_relu()
    assert G.cut_chain(graph, "sin") is None  # its producer is an input, not an op


def test_extract_keeps_only_the_named_ops_reading_the_rest_as_inputs():
    graph = _sin_sum_mul_relu()
    extracted = G.extract(graph, ["sum_1", "relu"])
    assert extracted is not None
    assert targets_of(extracted) == ["aten.sum.dim_IntList", "aten.relu.default"]
    assert _names(extracted, "placeholder") == ["sin", "mul"]
    assert [value.name for value in G.outputs(extracted)] == ["sum_1", "relu"]


def test_extract_brings_along_a_tuple_op_its_getitem_needs():
    graph = _max_dim_graph()
    extracted = G.extract(graph, ["getitem"])
    assert extracted is not None
    assert targets_of(extracted) == ["aten.max.dim", "operator.getitem"]
