"""`minify-worker minify` on a .pt2 whose weight is a pickle: refused unless the operator allows pickles.

A real offline command, a cheap test backend (no inductor compile).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from tests.support.archives import pickled_weight_archive
from tests.support.backends import ALLOWED, PREFIX


def run_offline(program: Path, out: Path, *python_options: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {key: value for key, value in os.environ.items() if key != "MINIFY_ALLOW_PICKLE"}
    environment.update(ALLOWED, **env)
    return subprocess.run([sys.executable, *python_options, "-m", "minify_worker.cli", "minify", str(program),
                           "--backend", f"{PREFIX}:fail_on_relu", "--out", str(out), "--quiet"],
                          capture_output=True, text=True, timeout=300, env=environment)


def test_the_offline_command_refuses_a_pickled_weight_and_nothing_runs(tmp_path: Path) -> None:
    """Refused from the file alone: no sandbox starts and the compiler is never imported (the
    command's preload and warm-up are for a program it will run), report.json says why."""
    done = run_offline(pickled_weight_archive(tmp_path, tmp_path / "ran"), tmp_path / "out", "-X", "importtime")

    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert "pickled_weight.pt2 is refused" in done.stdout
    assert "data/weights/weight_0 (weight 'fc1.weight' is marked use_pickle" in done.stdout
    assert "MINIFY_ALLOW_PICKLE=1" in done.stdout
    assert not (tmp_path / "ran").exists()
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["status"] == "failed" and "pickled_weight.pt2 is refused" in report["reason"]
    assert report["sandbox_start"] is None
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert "torch" in imported and "torch._inductor.compile_fx" not in imported


def test_the_offline_command_minifies_a_pickled_weight_where_the_operator_allows_pickles(tmp_path: Path) -> None:
    program = pickled_weight_archive(tmp_path, tmp_path / "ran", payload=torch.nn.Parameter(torch.randn(16, 10)))

    done = run_offline(program, tmp_path / "out", MINIFY_ALLOW_PICKLE="1")

    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["nodes_original"] == 3 and report["nodes_final"] == 1
