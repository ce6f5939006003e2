"""`minify-worker minify ... --out DIR` with a relative DIR, as the README writes it, run from a
working directory of its own: every artifact lands in DIR, and the command lists only files that
are there."""

from __future__ import annotations

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
    backend, without the phases after minimality: what is checked is where the files go)."""
    root = tmp_path_factory.mktemp("offline")
    program = save("relu_cos", root / "programs")
    cwd = root / "elsewhere"
    cwd.mkdir()
    done = subprocess.run([sys.executable, "-m", "minify_worker.cli", "minify", str(program), "--backend",
                           f"{PREFIX}:fail_on_relu", "--no-shrink", "--no-culprit", "--out", "out/relu", "--quiet"],
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
