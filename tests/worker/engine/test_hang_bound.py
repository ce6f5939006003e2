"""A hang the original showed is held to the original's bound (original.py `_hold_hang_to_bound`):
candidates are judged by a calibrated timeout far shorter than it, so the smallest program past that
timeout may be slow, not hung (a compile whose time grows with the program, pytorch#148073). The
result runs once more with the original's bound; one that ends within it raises the candidates'
timeout and the reduction starts again; repro.py holds its own run to that bound. Cheap test backends,
real sandbox children, repro.py run as a user runs it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from minify_contract.models import JobSpec, JobState, Milestone, ProgressEvent
from minify_worker.engine import HangCalibration, minify
from minify_worker.oracle import TIMEOUT_SIGNATURE
from minify_worker.programs.fx.repro import render_repro
from tests.support.backends import PREFIX
from tests.support.graphs import ops_of, save_chain
from tests.support.repro import run_repro

pytestmark = [pytest.mark.usefixtures("test_backends_allowed"), pytest.mark.waits]

# Candidates hang after 1 s at the least (the default floor, 5 s, would let relu's 2 s compile pass).
SHORT_CANDIDATES = HangCalibration(candidate_min_s=1.0)


def test_a_result_that_is_only_slow_does_not_stand_as_the_hang(tmp_path: Path) -> None:
    program = save_chain(tmp_path, ("sin", "cos", "relu", "tanh", "exp", "neg"))
    # relu alone compiles in 2 s, past the candidates' 1 s and within the original's 4 s; relu with
    # tanh never compiles; anything else at once.
    job = JobSpec.model_validate({"backend": f"{PREFIX}:slow_on_relu_alone_hang_with_tanh",
                                  "failure": {"kind": "timeout"}, "shrink": False, "culprit": False,
                                  "limits": {"original_timeout_s": 4, "parallelism": 2}})
    events: list[ProgressEvent] = []

    result = minify(program, job, tmp_path / "out", on_event=events.append, hang=SHORT_CANDIDATES)

    assert result.status is JobState.succeeded, result.reason
    assert result.report.signature == "TimedOut"
    assert ops_of(result.report.graph_code) == ["relu", "tanh"]  # not relu alone, which ends in 2 s
    refuted = [event.message for event in events if event.milestone is Milestone.hang_refuted]
    assert len(refuted) == 1 and "slow, not hung" in refuted[0], refuted
    assert result.report.candidate_timeout_s == 4  # raised to the original's bound (3x relu's run, at most it)
    # repro.py holds compiling and running to the bound the result was seen hanging past: the
    # original's 4 s. Past it, it says so, prints the stuck stack and exits 124, as timeout(1) does.
    repro = result.artifacts["repro.py"]
    assert "# Hang bound:       4 s" in repro.read_text()
    ran = run_repro(repro, timeout_s=120)
    assert ran.returncode == 124, ran.stderr[-3000:]
    assert "still compiling or running after 4 s, the bound minify saw it hang past" in ran.stderr
    assert "slow_on_relu_alone_hang_with_tanh" in ran.stderr  # the stack, where it hangs
    assert ran.stderr.rstrip().endswith("repro failed with: TimedOut")


@pytest.mark.parametrize("form", ["inline", "inputs.pt"])
def test_a_hangs_repro_that_ends_within_its_bound_passes_and_says_how_long_it_took(tmp_path: Path, form: str) -> None:
    """The fixed compiler's case: the program compiles and runs within the bound (relu alone, 2 s
    with this backend, against 30 s); in both of repro.py's forms (its inputs written inline, or
    read from inputs.pt by its `main`)."""
    graph = torch.fx.symbolic_trace(torch.nn.ReLU()).graph
    spec = JobSpec.model_validate({"backend": f"{PREFIX}:slow_on_relu_alone_hang_with_tanh",
                                   "failure": {"kind": "timeout"}})
    inputs = [torch.ones(3)]
    torch.save(inputs, tmp_path / "inputs.pt")
    repro = tmp_path / "repro.py"
    repro.write_text(render_repro(graph, spec, TIMEOUT_SIGNATURE, torch.__version__,
                                  inputs=inputs if form == "inline" else None, hang_bound_s=30.0))
    assert ("def main():" in repro.read_text()) is (form == "inputs.pt")

    ran = run_repro(repro, timeout_s=120)

    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "within the 30 s bound" in ran.stdout and "repro passed" in ran.stdout
