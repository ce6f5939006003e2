"""The bug's key, without a service: graph.graph_shape_hash (what a minimal graph is made of, not
its sizes or names) and minify_contract.bugs.bug_key over it and the signature."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx as fx

from minify_contract.bugs import bug_key
from minify_worker.programs.fx import graph as G

pytestmark = pytest.mark.fast

aten = torch.ops.aten


def one_op_graph(op: object = aten.relu.default, *, shape: list[int] | None = None, dtype: str = "float32",
                 device: str = "cpu", name: str = "x", value: str = "x") -> fx.Graph:
    """`op(input)` with the input's minify meta as the loader writes it."""
    graph = fx.Graph()
    node = graph.placeholder(name)
    node.meta.update({G.META_VALUE: value, G.META_KIND: "tensor",
                      G.META_TENSOR: {"shape": shape or [8], "dtype": dtype, "device": device, "stride": [1]}})
    graph.output((graph.call_function(op, (node,)),))
    return graph


def two_input_add(same_input: bool) -> fx.Graph:
    graph = fx.Graph()
    inputs = []
    for name in ("x", "y"):
        node = graph.placeholder(name)
        node.meta.update({G.META_VALUE: name, G.META_KIND: "tensor",
                          G.META_TENSOR: {"shape": [4], "dtype": "float32", "device": "cpu", "stride": [1]}})
        inputs.append(node)
    right = inputs[0] if same_input else inputs[1]
    graph.output((graph.call_function(aten.add.Tensor, (inputs[0], right)),))
    return graph


def view_to(sizes: list[int]) -> fx.Graph:
    graph = fx.Graph()
    node = graph.placeholder("x")
    node.meta.update({G.META_VALUE: "x", G.META_KIND: "tensor",
                      G.META_TENSOR: {"shape": sizes, "dtype": "float32", "device": "cpu", "stride": [1]}})
    graph.output((graph.call_function(aten.relu.default, (graph.call_function(aten.view.default, (node, sizes)),)),))
    return graph


def test_graph_shape_hash_ignores_sizes_names_and_value_keys() -> None:
    reference = G.graph_shape_hash(one_op_graph())
    assert G.graph_shape_hash(one_op_graph(shape=[4096, 4096])) == reference
    assert G.graph_shape_hash(one_op_graph(name="linear", value="linear")) == reference
    assert G.graph_shape_hash(view_to([2, 8])) == G.graph_shape_hash(view_to([64, 3]))


def test_graph_shape_hash_sees_ops_dtypes_devices_and_edges() -> None:
    reference = G.graph_shape_hash(one_op_graph())
    assert G.graph_shape_hash(one_op_graph(aten.sigmoid.default)) != reference
    assert G.graph_shape_hash(one_op_graph(dtype="float16")) != reference
    assert G.graph_shape_hash(one_op_graph(device="cuda:0")) != reference
    assert G.graph_shape_hash(two_input_add(True)) != G.graph_shape_hash(two_input_add(False))


def test_the_structural_hash_of_the_memo_still_tells_sizes_apart() -> None:
    small, large = view_to([2, 8]), view_to([64, 3])
    assert G.structural_hash(small) != G.structural_hash(large)


def test_bug_key_depends_on_the_signature_and_the_shape_and_nothing_else() -> None:
    key = bug_key("RuntimeError: injected failure on relu", "abc")
    assert key == bug_key("RuntimeError: injected failure on relu", "abc")
    assert len(key) == 24 and int(key, 16) >= 0
    assert bug_key("RuntimeError: injected failure on cos", "abc") != key
    assert bug_key("RuntimeError: injected failure on relu", "abd") != key


def every_kind_of_argument() -> fx.Graph:
    """A graph whose nodes hold each kind of argument the hashes write: a narrowed tensor input and a
    scalar one, lists, a tuple, ints, a float, a bool, a dtype, a dict, a string and a subgraph."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta.update({G.META_VALUE: "x", G.META_KIND: "tensor", G.META_NARROW: [(0, 2)],
                   G.META_TENSOR: {"shape": [4, 2], "dtype": "float32", "device": "cpu", "stride": [2, 1]}})
    n = graph.placeholder("n")
    n.meta.update({G.META_VALUE: "n", G.META_KIND: "scalar", G.META_SCALAR: "int"})
    scaled = graph.call_function(aten.mul.Tensor, (graph.call_function(aten.view.default, (x, [2, 4])), 0.5))
    summed = graph.call_function(aten.sum.dim_IntList, (scaled, [1], True), {"dtype": torch.float64})
    split = graph.call_function(aten.split_with_sizes.default, (summed, (1, 1)))
    branch = fx.Graph()
    branch.output((branch.call_function(aten.cos.default, (branch.placeholder("arg0"),)),))
    subgraph = graph.get_attr("true_graph_0")
    subgraph.meta[G.META_SUBGRAPH] = branch
    graph.output((graph.call_function(operator.getitem, (split, 0)), {"n": n, "name": "relu"}, subgraph))
    return graph


def test_the_hashes_and_the_bug_key_of_a_known_graph_never_change() -> None:
    # Bug ids live in Redis's bug index and in every report.json: a change here splits known bugs.
    graph = every_kind_of_argument()
    assert G.structural_hash(graph) == "edcc4cf2dd1f8430cc6e20f678e9d252bc9ec41574dde9207da9b405a6c1e0d4"
    assert G.graph_shape_hash(graph) == "79ac1fe2d604a8399b060492520681f6e42d74efe60a1ac8f73483480a645632"
    assert bug_key("RuntimeError: injected failure on relu", G.graph_shape_hash(graph)) == "3fbadfa5e97e18ff1fde32c9"
