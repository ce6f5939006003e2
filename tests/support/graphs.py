"""Small flat graphs built by hand, for tests that need no ExportedProgram."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.fx as fx


def chain_graph(*ops: str) -> fx.Graph:
    """x → aten ops... → output, with x read from the value store under the key "x"."""
    graph = fx.Graph()
    node = graph.placeholder("x")
    node.meta["minify_value"] = "x"
    for op in ops:
        node = graph.call_function(getattr(torch.ops.aten, op).default, (node,))
    graph.output((node,))
    return graph


def ops_of(code: str | None) -> list[str]:
    """The aten ops a graph's printed code calls, in order: "relu" for `torch.ops.aten.relu.default`."""
    return [line.split("torch.ops.aten.")[1].split(".")[0] for line in (code or "").splitlines()
            if "torch.ops.aten." in line]


def save_chain(directory: Path, ops: tuple[str, ...]) -> Path:
    """examples/programs.py's elementwise chain of `ops`, exported and saved as DIR/chain.pt2."""
    from examples import programs

    ep, _ = programs.chain(ops)
    path = directory / "chain.pt2"
    torch.export.save(ep, path)
    return path
