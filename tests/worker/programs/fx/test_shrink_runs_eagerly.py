"""The shrink phase keeps a program that runs: a shrunk candidate that raises when run eagerly on its
sliced values, where it runs on the whole values, is refused (`shrink.check_runs`), whatever a
compiler does with it (pytorch#183988: `x[randperm(8)]` was shrunk to a 1-row x, which a fake-tensor
check cannot see: an index's values are data).

The family: inputs whose size another input or an in-graph factory bounds by its values (a tensor
index, index_select, gather, embedding ids, randperm(n), arange(n)). The pure tests build the
candidates in this process; the engine test runs real sandbox children with a cheap backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.fx as fx

from minify_contract.models import JobSpec, JobState
from minify_worker.engine import minify
from minify_worker.programs.fx import graph as g
from minify_worker.programs.fx import shrink
from minify_worker.programs.fx.backends import ALLOWED_BACKENDS_ENV
from minify_worker.programs.fx.run import build_candidate
from tests.support.backends import PREFIX
from tests.support.graphs import ops_of
from tests.support.repro import run_repro

aten = torch.ops.aten
CPU = torch.device("cpu")


def _input(graph: fx.Graph, name: str, value: torch.Tensor) -> fx.Node:
    node = graph.placeholder(name)
    node.meta.update({g.META_VALUE: name, g.META_KIND: "tensor",
                      g.META_TENSOR: {"shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch."),
                                      "device": "cpu", "stride": list(value.stride())}})
    return node


def _indexed(how: str) -> tuple[fx.Graph, dict[str, Any]]:
    """A graph that reads the 8 rows of `x` (8x4) through indices 0..7: an input index tensor, or a
    factory in the graph; and its value store."""
    values: dict[str, Any] = {"x": torch.randn(8, 4), "index": torch.arange(8).flip(0)}
    graph = fx.Graph()
    x = _input(graph, "x", values["x"])
    if how in ("randperm", "arange"):
        del values["index"]
        factory = aten.randperm.default if how == "randperm" else aten.arange.default
        index = graph.call_function(factory, (8,), {"device": CPU})
    else:
        index = _input(graph, "index", values["index"])
    calls = {
        "index": (aten.index.Tensor, (x, [index])),
        "randperm": (aten.index.Tensor, (x, [index])),
        "arange": (aten.index.Tensor, (x, [index])),
        "index_select": (aten.index_select.default, (x, 0, index)),
        "embedding": (aten.embedding.default, (x, index)),
    }
    if how == "gather":
        column = graph.call_function(aten.unsqueeze.default, (index, 1))
        rows = graph.call_function(aten.expand.default, (column, [8, 4]))
        result = graph.call_function(aten.gather.default, (x, 0, rows))
    else:
        target, args = calls[how]
        result = graph.call_function(target, args)
    graph.output((result,))
    return graph, values


FAMILY = ["index", "index_select", "gather", "embedding", "randperm", "arange"]


@pytest.mark.parametrize("how", FAMILY)
def test_an_input_shrunk_below_the_indices_that_read_it_is_not_built(how: str) -> None:
    graph, values = _indexed(how)

    with pytest.raises(ValueError, match="raise when run eagerly, where its whole inputs run"):
        build_candidate(g.graph_to_wire(shrink.halved(graph, [("x", 0)])), values)


# gather's index is expanded to a literal 8x4: its columns are bound by the graph, not by data.
@pytest.mark.parametrize("how", [how for how in FAMILY if how != "gather"])
def test_dims_the_indices_do_not_bound_still_shrink(how: str) -> None:
    graph, values = _indexed(how)

    gm, inputs = build_candidate(g.graph_to_wire(shrink.to_ones(graph, [("x", 1)])), values)

    assert inputs[0].shape == (8, 1)
    gm(*inputs)


def test_a_program_that_raises_on_its_whole_values_too_still_shrinks() -> None:
    """A missing error's or a crash's premise (eager raises) is the program's, not the shrink's."""
    graph, values = _indexed("index")
    values["index"] = torch.tensor([0, 1, 40, 2, 3, 4, 5, 6])

    _, inputs = build_candidate(g.graph_to_wire(shrink.halved(graph, [("x", 0)])), values)

    assert inputs[0].shape == (4, 4)


class ShuffleRows(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x[torch.randperm(8)]) + 1


def test_a_job_shrinks_the_input_a_randperm_indexes_only_down_to_its_range(tmp_path: Path) -> None:
    """pytorch#183988's shape with a backend that fails compiling `index`: x's columns shrink to 1,
    its rows only as far as the permutation's values (kept in the graph, or promoted to an input
    and sliced) allow, and the minimized program runs eagerly on the delivered inputs."""
    torch.export.save(torch.export.export(ShuffleRows(), (torch.randn(8, 64),)), tmp_path / "program.pt2")
    spec = JobSpec.model_validate({"backend": f"{PREFIX}:fail_on_index", "culprit": False, "versions": False,
                                   "limits": {"candidate_timeout_s": 60, "parallelism": 2}})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ALLOWED_BACKENDS_ENV, PREFIX)
        result = minify(tmp_path / "program.pt2", spec, tmp_path / "out")

    assert result.status is JobState.succeeded, result.reason
    assert ops_of(result.report.graph_code)[-1] == "index"
    assert result.report.input_shapes_final["x"].shape[1] == 1
    # x's rows below the indices' values were refused: the delivered program runs eagerly. (Not
    # `outcomes["invalid"] >= 1`: with two slots the refused halving can be cancelled before it is
    # built, when its sibling settles the step first.)
    program = torch.export.load(tmp_path / "out" / "minimized.pt2")
    program.module()(*torch.load(tmp_path / "out" / "inputs.pt", weights_only=True))
    ran = run_repro(tmp_path / "out" / "repro.py", **{ALLOWED_BACKENDS_ENV: PREFIX})
    assert "repro failed with: RuntimeError: injected failure on index" in ran.stderr, ran.stderr[-2000:]
