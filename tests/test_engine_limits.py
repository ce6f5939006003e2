"""Defaults that work on hangs and memory blow-ups (issue 12, points 6 and 7): cheap test backends,
real sandbox children, the engine end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from minify_client.models import JobSpec, JobState
from minify_worker.engine import minify
from tests.support.graphs import ops_of, save_chain

SUPPORT = "tests.support.backends"


pytestmark = pytest.mark.usefixtures("test_backends_allowed")


@pytest.fixture(scope="module")
def chain_pt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_chain(tmp_path_factory.mktemp("programs"), ("sin", "cos", "relu", "tanh", "exp", "neg"))


def test_a_hanging_compile_is_minimized_with_the_default_failure_kind(chain_pt2: Path, tmp_path: Path) -> None:
    # The default spec but for a short bound on the original's runs (the default is minutes).
    job = JobSpec.model_validate({"backend": f"{SUPPORT}:hang_on_relu",
                                  "limits": {"original_timeout_s": 6, "parallelism": 2}})

    result = minify(chain_pt2, job, tmp_path / "out")

    assert result.status is JobState.succeeded, result.reason
    assert ops_of(result.report.graph_code) == ["relu"]
    assert result.report.signature == "TimedOut"
    # Passing candidates calibrated the timeout down to the floor: each hang costs seconds.
    assert result.report.candidate_timeout_s is not None and result.report.candidate_timeout_s <= 6


def test_a_hang_with_failure_timeout_calibrates_the_candidate_timeout_from_passing_runs(
        chain_pt2: Path, tmp_path: Path) -> None:
    job = JobSpec.model_validate({"backend": f"{SUPPORT}:hang_on_relu", "failure": {"kind": "timeout"},
                                  "limits": {"candidate_timeout_s": 10, "parallelism": 2}})

    result = minify(chain_pt2, job, tmp_path / "out")

    assert result.status is JobState.succeeded, result.reason
    assert ops_of(result.report.graph_code) == ["relu"]
    assert result.report.candidate_timeout_s == 5.0  # the floor: passing candidates take milliseconds


def test_a_compiler_that_eats_all_memory_is_minimized_as_an_oom(chain_pt2: Path, tmp_path: Path) -> None:
    job = JobSpec.model_validate({"backend": f"{SUPPORT}:allocate_on_relu", "failure": {"kind": "oom"},
                                  "limits": {"memory_mb": 700, "candidate_timeout_s": 60, "parallelism": 2}})

    result = minify(chain_pt2, job, tmp_path / "out")

    assert result.status is JobState.succeeded, result.reason
    assert ops_of(result.report.graph_code) == ["relu"]
    assert result.report.signature == "OutOfMemory"


def test_any_failure_includes_running_out_of_memory(chain_pt2: Path, tmp_path: Path) -> None:
    job = JobSpec.model_validate({"backend": f"{SUPPORT}:allocate_on_relu",
                                  "limits": {"memory_mb": 700, "candidate_timeout_s": 60, "parallelism": 2}})

    result = minify(chain_pt2, job, tmp_path / "out")

    assert result.status is JobState.succeeded, result.reason
    assert ops_of(result.report.graph_code) == ["relu"]
