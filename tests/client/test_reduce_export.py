"""`minify-client reduce` on a failure inside torch.export, which the script calls itself: with
torch.compile off (`TORCHDYNAMO_DISABLE=1`) it fails the same, so the reference runs also have
torch.export hand back the module to run as it is (`rerun.export_eagerly`); the reduction is held to
failing inside export and passing so. A script that fails that way too is refused, with both runs
named. The bug is export's own refusal of a branch on a tensor's value, the same on every torch.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from minify_client.capture import rerun
from minify_client.reduce import ReduceRefused, reduce_script

EXPORT_FAILS = '''import torch


class Gate(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x.cos()
        return x.sin()


x = torch.ones(3)
expected = Gate()(x)
program = torch.export.export(Gate(), (x,))
print(program.module()(x) - expected)
'''

def _run(script: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    """`script` as `python -m minify_client.capture.rerun` runs it (the runs reduce makes)."""
    return subprocess.run([sys.executable, "-m", "minify_client.capture.rerun", script.name], cwd=script.parent,
                          env={**os.environ, **settings}, capture_output=True, text=True, timeout=300)


def test_a_failure_inside_torch_export_is_reduced_against_the_module_run_as_it_is(tmp_path: Path) -> None:
    script = tmp_path / "gate.py"
    script.write_text(EXPORT_FAILS)

    reduced = reduce_script(script, jobs=2, budget_s=300)

    assert reduced.passes_without == "torch.compile or torch.export (the module run as it is)"
    # A branch on a tensor's value is export refusing the program as written, and the result says so.
    assert reduced.export_refusal in rerun.EXPORT_REFUSALS, reduced.failure
    assert "not a bug report" in reduced.meaning()
    assert reduced.failure.raised_at == "if x.sum() > 0:" and reduced.lines_after < reduced.lines_before
    assert "torch.export.export(Gate(), (x,))" in reduced.source and "expected" not in reduced.source
    out = tmp_path / "gate.min.py"
    out.write_text(reduced.source)
    assert _run(out).returncode != 0
    assert _run(out, TORCHDYNAMO_DISABLE="1").returncode != 0  # export is on without torch.compile
    eager = _run(out, TORCHDYNAMO_DISABLE="1", **{rerun.EAGER_EXPORT_ENV: "1"})
    assert eager.returncode == 0, eager.stderr[-2000:]
    assert script.read_text() == EXPORT_FAILS


def test_a_script_that_fails_without_export_too_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "gate.py"
    script.write_text(EXPORT_FAILS.replace("print(program.module()(x) - expected)", "print(program.graph_module)"))
    with pytest.raises(ReduceRefused, match=r"fails inside torch.export with torch.compile off .* and also with "
                                            r"torch.export handing back the module to run as it is "
                                            r"\(AttributeError"):
        reduce_script(script, jobs=2, budget_s=60)
