"""StableHLO jobs end to end (issue 32), through `minify-worker minify program.mlir` (the format
told from the suffix) with real sandbox children: a 24-op program that XLA's
`xla_cpu_enable_fast_min_max` makes drop a NaN minimizes to the reduce-max, and its repro.py
reproduces with jax alone (torch blocked) in a fresh process; the same program through an
external compiler (`backend: command`) that crashes on some candidates."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minify_contract.models import Report
from minify_worker import cli
from minify_worker.programs.stablehlo.command import ALLOWED_COMMANDS_ENV
from tests.support import hlo_programs

COMPILER = Path(__file__).resolve().parents[3] / "support" / "hlo_compiler.py"

# The repro runs with torch made unimportable: it must need jax and numpy only.
WITHOUT_TORCH = "import runpy, sys; sys.modules['torch'] = None; sys.argv = sys.argv[1:]; " \
                "runpy.run_path(sys.argv[0], run_name='__main__')"

# Its module-scoped fixtures (a sandbox pool, a job) run once: every test of the module on one xdist worker.
pytestmark = pytest.mark.xdist_group("test_stablehlo_engine")


def _minify(arguments: list[str]) -> int:
    """`minify-worker minify ARGUMENTS` in this process, which keeps its own SIGTERM handler after."""
    handler = signal.getsignal(signal.SIGTERM)
    try:
        return cli.main(["minify", *arguments])
    finally:
        signal.signal(signal.SIGTERM, handler)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Report, Path]:
    folder = tmp_path_factory.mktemp("nan_max_job")
    text, arrays = hlo_programs.nan_max_program()
    program, inputs = hlo_programs.write_program(folder, text, arrays)
    code = _minify([str(program), "--inputs", str(inputs), "--backend", "xla",
                    "--config", "xla.xla_cpu_enable_fast_min_max=true", "--failure", "accuracy",
                    "--strict-accuracy", "--parallelism", "2", "--quiet", "--out", str(folder / "out")])
    assert code == 0
    return Report.model_validate_json((folder / "out" / "report.json").read_text()), folder


def _repro(folder: Path, *arguments: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", WITHOUT_TORCH, str(folder / "out" / "repro.py"), *arguments],
                          capture_output=True, text=True, timeout=120, check=False, env=env)


def test_the_job_minimizes_to_the_reduce_max(job) -> None:
    report, _ = job
    assert report.status == "succeeded", report.reason
    assert (report.nodes_original, report.nodes_final) == (24, 1)
    assert report.input_shapes_final["v6"].shape == [4, 4]  # 8 halved; 4 keeps the NaN at [1, 2]
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


def test_a_command_that_crashes_on_some_candidates_still_leads_to_the_op_it_refuses(tmp_path: Path) -> None:
    program, _ = hlo_programs.write_program(tmp_path, hlo_programs.nan_max_program()[0])
    argv = json.dumps([sys.executable, str(COMPILER), "{module}"])
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ALLOWED_COMMANDS_ENV, str(Path(sys.executable).resolve().parent))
        code = _minify([str(program), "--backend", "command", "--config", f"command.argv={argv}",
                        "--failure", "compile_error", "--parallelism", "2", "--quiet", "--out", str(tmp_path / "out")])
    report = Report.model_validate_json((tmp_path / "out" / "report.json").read_text())
    assert code == 0, report.reason
    assert report.signature == "CommandFailed: reduce-max is not supported on this target"
    assert report.nodes_final == 1 and "stablehlo.reduce" in report.graph_code
    assert report.outcomes.get("crashed", 0) >= 1
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    repro = _repro(tmp_path, env={**os.environ, "TMPDIR": str(scratch)})
    assert repro.returncode != 0
    assert "repro failed with: CommandFailed: reduce-max is not supported on this target" in repro.stderr
    assert list(scratch.iterdir()) == []  # the command's inputs went in a folder the repro removed
