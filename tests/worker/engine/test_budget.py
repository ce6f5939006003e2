"""A job's children at once (`default_parallelism`): the job's own, else the worker's
(`MINIFY_PARALLELISM`, `minify-worker --parallelism`), else what the device holds; a bad worker
setting is refused when the worker or the offline command starts, before any job."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from minify_contract.models import JobSpec
from minify_worker.engine.budget import default_parallelism
from minify_worker.sandbox.limits import PARALLELISM_ENV, usable_cores, worker_parallelism


def spec(**fields: object) -> JobSpec:
    return JobSpec.model_validate(fields)


@pytest.mark.fast
def test_the_jobs_own_parallelism_then_the_workers_then_the_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PARALLELISM_ENV, raising=False)
    assert default_parallelism(spec()) == max(1, min(usable_cores(), 16))
    assert default_parallelism(spec(device="cuda")) == max(1, min(usable_cores(), 4))
    assert default_parallelism(spec(limits={"parallelism": 3})) == 3

    monkeypatch.setenv(PARALLELISM_ENV, " 5 ")
    assert worker_parallelism() == 5
    assert default_parallelism(spec()) == 5
    assert default_parallelism(spec(device="cuda")) == 5  # the operator's word, past the device's cap
    assert default_parallelism(spec(limits={"parallelism": 3})) == 3  # the job's own wins

    monkeypatch.setenv(PARALLELISM_ENV, "")
    assert worker_parallelism() is None


@pytest.mark.fast
@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", "257"])
def test_a_worker_parallelism_that_is_no_count_of_children_says_so(monkeypatch: pytest.MonkeyPatch,
                                                                    value: str) -> None:
    monkeypatch.setenv(PARALLELISM_ENV, value)
    with pytest.raises(ValueError, match=f"MINIFY_PARALLELISM must be a whole number from 1 to 256, not '{value}'"):
        default_parallelism(spec())
    assert default_parallelism(spec(limits={"parallelism": 2})) == 2  # a job that sets its own never reads it


def test_the_worker_refuses_a_bad_parallelism_at_start_not_in_a_job() -> None:
    """As flag and as environment, before it reaches for Redis (the URL leads nowhere)."""
    command = [sys.executable, "-m", "minify_worker.cli", "--redis-url", "redis://127.0.0.1:9/0", "--burst"]
    flag = subprocess.run([*command, "--parallelism", "0"], capture_output=True, text=True, timeout=60)
    environment = subprocess.run(command, env={**os.environ, PARALLELISM_ENV: "all"}, capture_output=True,
                                 text=True, timeout=60)

    assert flag.returncode == 2
    assert "--parallelism (or MINIFY_PARALLELISM) must be a whole number from 1 to 256, not '0'" in flag.stderr
    assert environment.returncode == 2
    assert "not 'all'" in environment.stderr


def test_the_offline_command_refuses_a_bad_worker_parallelism_before_the_job(tmp_path: Path) -> None:
    program = tmp_path / "program.pt2"
    program.write_bytes(b"")  # never read: the refusal comes first
    refused = subprocess.run([sys.executable, "-m", "minify_worker.cli", "minify", str(program), "--out",
                              str(tmp_path / "out")], env={**os.environ, PARALLELISM_ENV: "0"}, capture_output=True,
                             text=True, timeout=60)

    assert refused.returncode == 2
    assert "MINIFY_PARALLELISM must be a whole number from 1 to 256, not '0' (or pass --parallelism)" in refused.stderr
    assert not (tmp_path / "out").exists()
