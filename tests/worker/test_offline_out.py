"""`minify-worker minify ... --out DIR` with a relative DIR, as the README writes it, run from a
working directory of its own: every artifact lands in DIR, and the command lists only files that
are there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from examples.programs import save
from tests.support.backends import ALLOWED, PREFIX

ALL_ARTIFACTS = {"minimized.pt2", "repro.py", "signature_rules.py", "inputs.pt", "report.json", "bundle.tar.gz"}


@pytest.fixture(scope="module")
def relative_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The README's offline example with `--out out/relu`, run in a folder of its own (on a test
    backend, without shrinking the inputs; with the culprit phase, whose line follows the result's)."""
    root = tmp_path_factory.mktemp("offline")
    program = save("relu_cos", root / "programs")
    cwd = root / "elsewhere"
    cwd.mkdir()
    done = subprocess.run([sys.executable, "-m", "minify_worker.cli", "minify", str(program), "--backend",
                           f"{PREFIX}:fail_on_relu", "--failure", "compile_error", "--no-shrink", "--out", "out/relu",
                           "--quiet"],
                          cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **ALLOWED})
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return cwd, done


def listed_artifacts(cwd: Path, stdout: str) -> tuple[Path, set[str]]:
    """The folder and the names of the command's 'artifacts in DIR: a, b' line."""
    (listing,) = [line for line in stdout.splitlines() if line.startswith("artifacts in ")]
    folder, _, names = listing.removeprefix("artifacts in ").partition(": ")
    return cwd / folder, set(names.split(", "))


def test_every_artifact_listed_is_where_the_command_says(relative_run):
    cwd, done = relative_run
    folder, listed = listed_artifacts(cwd, done.stdout)
    assert listed <= {path.name for path in folder.iterdir()}


def test_a_relative_out_gets_every_artifact(relative_run):
    cwd, done = relative_run
    folder, listed = listed_artifacts(cwd, done.stdout)
    assert folder.resolve() == (cwd / "out" / "relu").resolve()
    assert listed == ALL_ARTIFACTS
    assert {path.name for path in folder.iterdir()} == ALL_ARTIFACTS


def test_the_offline_command_prints_the_result_first_and_the_culprit_after(relative_run):
    # Its --json prints one document, the final report with the culprit: test_engine.py's offline
    # command test holds that on its own run.
    cwd, done = relative_run
    lines = done.stdout.splitlines()
    result = next(index for index, line in enumerate(lines) if line.startswith("status: succeeded"))
    pending = next(index for index, line in enumerate(lines) if line.startswith("culprit: pending"))
    artifacts = next(index for index, line in enumerate(lines) if line.startswith("artifacts in "))
    assert result < pending < artifacts and lines[-1].startswith("culprit: none (the custom backend")
    assert json.loads((cwd / "out" / "relu" / "report.json").read_text())["culprit_state"] == "done"
