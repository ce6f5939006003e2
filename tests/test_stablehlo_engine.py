"""A StableHLO job end to end (issue 32): `minify-worker minify program.mlir` (the format told
from the suffix) with real sandbox children minimizes a 24-op program that XLA's
`xla_cpu_enable_fast_min_max` makes drop a NaN down to the reduce-max, and its repro.py
reproduces with jax alone (torch blocked) in a fresh process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minify_client.models import Report
from minify_worker import cli
from tests.support import hlo_programs

# The repro runs with torch made unimportable: it must need jax and numpy only.
WITHOUT_TORCH = "import runpy, sys; sys.modules['torch'] = None; sys.argv = sys.argv[1:]; " \
                "runpy.run_path(sys.argv[0], run_name='__main__')"


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Report, Path]:
    folder = tmp_path_factory.mktemp("nan_max_job")
    text, arrays = hlo_programs.nan_max_program()
    program, inputs = hlo_programs.write_program(folder, text, arrays)
    code = cli.main(["minify", str(program), "--inputs", str(inputs), "--backend", "xla",
                     "--config", "xla.xla_cpu_enable_fast_min_max=true", "--failure", "accuracy",
                     "--strict-accuracy", "--parallelism", "2", "--quiet", "--out", str(folder / "out")])
    assert code == 0
    return Report.model_validate_json((folder / "out" / "report.json").read_text()), folder


def _repro(folder: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", WITHOUT_TORCH, str(folder / "out" / "repro.py"), *arguments],
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_job_minimizes_to_the_reduce_max(job) -> None:
    report, _ = job
    assert report.status == "succeeded", report.reason
    assert (report.nodes_original, report.nodes_final) == (24, 1)
    assert "stablehlo.reduce" in report.graph_code and "applies stablehlo.maximum" in report.graph_code
    assert report.signature == "AccuracyError" and report.backend == "xla"
    assert {"minimized.mlir", "minimized.hlo", "inputs.npz", "repro.py", "report.json"} <= set(report.artifacts)


def test_the_repro_fails_with_jax_alone_and_passes_once_the_nan_is_gone(job, tmp_path: Path) -> None:
    _, folder = job
    failing = _repro(folder)
    assert failing.returncode != 0, failing.stdout
    assert "repro failed with: AccuracyError" in failing.stderr
    assert "minify expected:   AccuracyError" in failing.stderr
    with np.load(folder / "out" / "inputs.npz") as archive:
        arrays = {name: np.nan_to_num(archive[name]) for name in archive.files}
    np.savez(tmp_path / "clean.npz", **arrays)
    passing = _repro(folder, "--inputs", str(tmp_path / "clean.npz"))
    assert passing.returncode == 0, passing.stderr
    assert "repro passed" in passing.stdout
