"""The bug's key, without a service: graph.graph_shape_hash (what a minimal graph is made of, not
its sizes or names) and minify_client.bugs.bug_key over it and the signature."""

from __future__ import annotations

import torch
import torch.fx as fx

from minify_client.bugs import bug_key
from minify_worker import graph as G

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
