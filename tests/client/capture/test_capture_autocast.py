"""Programs compiled with torch.autocast: a region inside the compiled function (dynamo's graph
holds it, export writes it as `wrap_with_autocast`), and the region the compiled function is called
in (dynamo keeps it out of the graph; the capture records it as the spec's `autocast`). Mixed
precision code casts back with `y.float()` after a region: the accuracy check judges what follows
against fp64 through that cast (tests/contract/test_accuracy_casts.py), and export's dtype assert
for it, wrong inside a region's body, is not the program's (`ingest`). The test backend adds 1 to
relu's results (tests/support/backends.py); pytorch#179804, the real bug of the outer region, is
tests/test_realbugs.py's."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch

from minify_client.capture import capture_failures
from minify_contract.models import JobSpec, JobState
from minify_worker.engine import minify
from tests.support.backends import wrong_on_relu
from tests.support.graphs import ops_of
from tests.support.repro import run_repro


def inner_region(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ w
    return torch.relu(y.float()).sin()


def compiled(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    torch._dynamo.reset()
    return torch.compile(inner_region, backend=wrong_on_relu)(x, w)


@pytest.mark.usefixtures("test_backends_allowed")
@pytest.mark.parametrize("outer", [False, True], ids=["region-inside", "called-in-a-region-too"])
def test_a_wrong_value_after_an_autocast_region_is_captured_minimized_and_reproduced(
        outer: bool, tmp_path: Path) -> None:
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    around = torch.autocast("cpu", dtype=torch.float16) if outer else contextlib.nullcontext()
    with capture_failures(torch.nn.Module(), (x, w), save_to=tmp_path / "c", accuracy=True) as block, around:
        compiled(x, w)
    assert block.captured is not None
    recorded = json.loads((tmp_path / "c" / "spec.json").read_text())
    assert recorded["autocast"] == ({"device": "cpu", "dtype": "float16"} if outer else None)

    spec = JobSpec.model_validate({**recorded, "culprit": False, "versions": False, "shrink": False,
                                   "limits": {"candidate_timeout_s": 60, "parallelism": 2}})
    result = minify(block.captured.program, spec, tmp_path / "out", inputs=tmp_path / "c" / "inputs.pt")

    assert result.status is JobState.succeeded, result.reason
    assert ops_of(result.report.graph_code) == ["relu"]
    ran = run_repro(tmp_path / "out" / "repro.py")
    assert "repro failed with: AccuracyError" in ran.stderr, ran.stderr[-2000:]
