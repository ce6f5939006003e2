"""The version phase on real torch releases: `make test-versions` (not part of `make test`) builds
.venv-torch-2.11, -2.14 and -2.15 and names them in MINIFY_TEST_TORCH_RELEASES (any subset works:
`MINIFY_TEST_TORCH_RELEASES=.venv-torch-2.14 pytest tests/worker/service/test_versions_releases.py`); a job
minimized on .venv's torch (2.13) then runs its repro.py under each of them (MINIFY_TORCH_ENVS).

Two bugs. The injected relu bug (inductor's `cpp.inject_relu_bug_TESTING_ONLY`, a real inductor
compile on every release) fails on all four: the range says the oldest fails too. No real
inductor or dynamo bug that differs between these releases was searched for here (that search
was not available to this change): `fail_on_relu_from_2_13_until_2_14` (tests/support/torch_versions.py)
stands in for one, a backend that fails on torch 2.13.x only, here with each release's own torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minify_worker.service.versions.envs import interpreter_of, own_env, read_version
from minify_worker.service.versions.ranges import parse_version, sort_versions
from tests.support.backends import PREFIX
from tests.support.torch_versions import MODULE

RELEASES = os.environ.get("MINIFY_TEST_TORCH_RELEASES", "").split()

pytestmark = pytest.mark.skipif(not RELEASES, reason="make test-versions names the release venvs "
                                                     "(MINIFY_TEST_TORCH_RELEASES)")


def minify_offline(program: Path, out: Path, *flags: str) -> dict:
    env = {**os.environ, "MINIFY_ALLOWED_BACKENDS": f"{PREFIX},{MODULE}", "MINIFY_TORCH_ENVS": ":".join(RELEASES)}
    done = subprocess.run([sys.executable, "-m", "minify_worker.cli", "minify", str(program), "--out", str(out),
                           "--quiet", "--no-culprit", *flags], capture_output=True, text=True, timeout=1800, env=env)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return json.loads((out / "report.json").read_text())


def outcomes(report: dict) -> dict[str, str]:
    """release (without its local label) -> outcome."""
    return {run["torch"].split("+")[0]: run["outcome"] for run in report["versions"]}


def releases() -> list[str]:
    """Every release tried, the CI venv's included, without local labels, oldest first."""
    found = [read_version(interpreter_of(venv))[0] for venv in RELEASES] + [own_env().torch]
    return sort_versions([version.split("+")[0] for version in found])


def test_the_injected_relu_bug_fails_on_every_release_so_there_is_no_range(
        programs: dict[str, Path], tmp_path: Path) -> None:
    report = minify_offline(programs["relu_cos"], tmp_path / "relu",
                            "--config", "cpp.inject_relu_bug_TESTING_ONLY=compile_error")

    assert outcomes(report) == dict.fromkeys(releases(), "same"), report
    assert report["regression_range"] is None
    assert report["regression_reason"].startswith(f"the oldest version tried ({releases()[0]}")
    assert report["fixed_in"] is None
    print(report["versions_summary"])


def test_a_bug_of_2_13_only_has_its_range_and_its_fix(programs: dict[str, Path], tmp_path: Path) -> None:
    report = minify_offline(programs["relu_cos"], tmp_path / "standin",
                            "--backend", f"{MODULE}:fail_on_relu_from_2_13_until_2_14", "--failure", "compile_error")

    expected = {version: "same" if version.startswith("2.13.") else "passes" for version in releases()}
    assert outcomes(report) == expected, report
    older = [version for version in releases() if parse_version(version) < parse_version("2.13.0")]
    newer = [version for version in releases() if parse_version(version) >= parse_version("2.14.0")]
    if older:
        assert report["regression_range"]["last_good"].split("+")[0] == older[-1]
        assert report["regression_range"]["first_bad"].startswith("2.13.")
    else:
        assert report["regression_range"] is None
    assert (report["fixed_in"] or "").split("+")[0] == (newer[0] if newer else "")
    print(report["versions_summary"])
