"""A capture run as the worker runs it, in the test's own process.

The capture tests' question is whether what the capture wrote (its .pt2, inputs.pt and spec.json)
fails in the worker as it did for the user. `run_as_the_worker` answers it with the worker's own
steps, cheaply: `prepare` records the values as a job's opening does (up to a failing op where the
job's kind lets eager fail), then one candidate, the whole program, runs here instead of in a sandbox
child. The candidate runner sets the spec's config globally, as a child does; tests/conftest.py puts
it back after the test.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from minify_client.capture import crash
from minify_contract import zero_tensors
from minify_contract.models import JobSpec
from minify_worker.outcomes import Outcome
from minify_worker.programs.fx.prepare import PROGRAM_JSON, VALUES, prepare
from minify_worker.programs.fx.run import run_wire_candidate


def run_as_the_worker(directory: Path, workdir: Path | None = None) -> Outcome:
    """The worker's outcome for the capture in `directory`, with its captured spec, as a job's first
    check runs it; `workdir` holds the prepared program and the candidate's files (default: a folder
    in `directory`)."""
    directory = Path(directory)
    spec = JobSpec.model_validate_json((directory / "spec.json").read_text())
    workdir = Path(workdir) if workdir is not None else directory / "as_the_worker"
    (program,) = directory.glob("*.pt2")
    prepare(program, directory / "inputs.pt", workdir, device=spec.device,
            eager_may_fail=spec.failure.kind in ("accuracy", "crash"))
    wire_graph = json.loads((workdir / PROGRAM_JSON).read_text())["graph"]
    values = zero_tensors.decode(torch.load(workdir / VALUES, weights_only=True))  # as the sandbox's store
    return run_wire_candidate(wire_graph, values, spec, workdir)


def only_entry(directory: Path) -> dict:
    """The one capture of the manifest in `directory` (a capture run that was to capture one bug)."""
    entries = json.loads((Path(directory) / "captures.json").read_text())["captures"]
    assert len(entries) == 1, entries
    return entries[0]


def no_pending(directory: Path) -> None:
    """Nothing left pending in `directory` (crash and hang capture: capture/crash.py)."""
    assert not list((Path(directory) / crash.PENDING).glob("*")), "a pending capture was left behind"
