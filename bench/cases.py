"""The benchmark's cases: failing programs as flat aten ExportedPrograms, saved as .pt2.

Both minifiers start from the same file: ours takes it as is; torch's gets its
`graph_module` (the flat graph, parameters and buffers as placeholders) and the matching values
(bench/torch_side.py). Every case fails through `cpp.inject_relu_bug_TESTING_ONLY`, so each needs a
relu somewhere.

Decomposition: core aten plus inductor's own decompositions, which is the graph torch's minifier
sees in real use (after_aot dumps the graph after AOT autograd ran inductor's decompositions) and
the only form its `inductor_fails` can compile: `compile_fx_inner` does not decompose, and on a
core-aten op inductor decomposes instead of lowering (`aten._softmax`) it raises
"AssertionError: both a fallback and a decomp for same op". The `*_core` cases keep plain core
aten to show what torch's minifier does then: every candidate "fails" with that assertion and it
drifts to it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import programs  # examples/ is a folder of scripts, not a package


def relu_cos(device: str = "cpu") -> torch.export.ExportedProgram:
    """The seed graph (relu then cos): two ops."""
    return programs.relu_cos(device)[0]


def transformer_layer(device: str = "cpu") -> torch.export.ExportedProgram:
    """nn.TransformerEncoderLayer, fast path off, relu feed-forward."""
    return programs.transformer_layer(layers=1, device=device)[0]


def transformer_stack4(device: str = "cpu") -> torch.export.ExportedProgram:
    """Four of those layers stacked (nn.TransformerEncoder)."""
    return programs.transformer_layer(layers=4, device=device)[0]


# name -> (builder on a device, decomposition table)
CASES: dict[str, tuple[Callable[[str], torch.export.ExportedProgram], str]] = {
    "relu_cos": (relu_cos, "inductor"),
    "transformer_layer": (transformer_layer, "inductor"),
    "transformer_stack4": (transformer_stack4, "inductor"),
    "transformer_layer_core": (transformer_layer, "core"),
}
DEFAULT_CASES = ("relu_cos", "transformer_layer", "transformer_stack4")


def decomposed(program: torch.export.ExportedProgram, table: str) -> torch.export.ExportedProgram:
    """`table`: "inductor" (core aten plus inductor's decompositions) or "core"."""
    if table == "core":
        return program.run_decompositions()
    import torch._inductor.lowering  # its max-pool decomposition asks the lowering module
    from torch._inductor.decomposition import select_decomp_table

    decompositions = torch.export.default_decompositions()
    decompositions.update(select_decomp_table())
    return program.run_decompositions(decompositions)


def count_ops(graph: torch.fx.Graph) -> int:
    """Call_function nodes: the op count both sides report."""
    return sum(1 for node in graph.nodes if node.op == "call_function")


def save_case(name: str, directory: Path, device: str = "cpu") -> tuple[Path, int]:
    """Write case `name`, built on `device`, as DIR/NAME.pt2, decomposed; return the path and its op count.

    The count is taken from the program as it loads back, since that is what both sides see.
    """
    builder, table = CASES[name]
    program = decomposed(builder(device), table)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.pt2"
    torch.export.save(program, path)
    return path, count_ops(torch.export.load(path).graph_module.graph)
