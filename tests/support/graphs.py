"""Small programs for the tests: flat graphs built by hand (for tests that need no ExportedProgram),
saved programs, and the ops a graph calls."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.fx as fx

from minify_worker.programs.fx.graph import flat_graph_from_exported_program, target_name

# The minimal program of an aot_inductor bug on relu in examples/programs.py's linear_relu_sigmoid
# (or its dict form), as minimized.pt2's module prints it: relu of the linear, now an input.
AOTI_RELU_CODE = """\
def forward(self, linear):
    linear, = fx_pytree.tree_flatten_spec(([linear], {}), self._in_spec)
    relu = torch.ops.aten.relu.default(linear);  linear = None
    return pytree.tree_unflatten((relu,), self._out_spec)"""


def chain_graph(*ops: str) -> fx.Graph:
    """x → aten ops... → output, with x read from the value store under the key "x"."""
    graph = fx.Graph()
    node = graph.placeholder("x")
    node.meta["minify_value"] = "x"
    for op in ops:
        node = graph.call_function(getattr(torch.ops.aten, op).default, (node,))
    graph.output((node,))
    return graph


def flat_chain(ops: tuple[str, ...]) -> fx.Graph:
    """examples/programs.py's elementwise chain of `ops`, exported and flattened as the loader does."""
    from examples import programs

    ep, _ = programs.chain(ops)
    return flat_graph_from_exported_program(ep)


def ops_of(graph: fx.Graph | str | None) -> list[str]:
    """The aten ops a graph calls, in order, by name ("relu" for `torch.ops.aten.relu.default`): of an
    fx.Graph, or of a graph's printed code (a report's `graph_code`)."""
    if isinstance(graph, fx.Graph):
        return [node.target.__name__.split(".")[0] for node in graph.nodes
                if node.op == "call_function" and getattr(node.target, "namespace", None) == "aten"]
    return [line.split("torch.ops.aten.")[1].split(".")[0] for line in (graph or "").splitlines()
            if "torch.ops.aten." in line]


def targets_of(graph: fx.Graph) -> list[str]:
    """The targets a graph calls, in order, by their qualified names: "aten.relu.default"."""
    return [target_name(node.target) for node in graph.nodes if node.op == "call_function"]


def marked_kernel(directory: Path, marker: str, op: torch._ops.OpOverload) -> fx.Graph:
    """`op(x * marker)` on an 8-element `x` (its value saved as DIR/values.pt): one kernel whose
    source holds `marker`, so a test finds it in the shared compile cache or a compiler's command."""
    torch.save({"x": torch.randn(8)}, directory / "values.pt")
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["minify_value"] = "x"
    graph.output((graph.call_function(op, (graph.call_function(torch.ops.aten.mul.Tensor, (x, float(marker))),)),))
    return graph


def save_chain(directory: Path, ops: tuple[str, ...]) -> Path:
    """examples/programs.py's elementwise chain of `ops`, exported and saved as DIR/chain.pt2."""
    from examples import programs

    ep, _ = programs.chain(ops)
    path = directory / "chain.pt2"
    torch.export.save(ep, path)
    return path


class CosSinRelu(torch.nn.Module):
    """Op kinds in order cos, sin, relu, add: bisection over kinds tries cos and sin first."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.sin(torch.cos(x))
        return torch.relu(y) + y


def save_cos_sin_relu(directory: Path) -> Path:
    """`CosSinRelu` on an 8x8 input, exported and saved as DIR/cos_sin_relu.pt2."""
    path = directory / "cos_sin_relu.pt2"
    torch.export.save(torch.export.export(CosSinRelu(), (torch.randn(8, 8),)), path)
    return path
