"""Spec limits that would overflow the timers they become are refused before any job starts."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from minify_contract.models import MAX_TIMEOUT_S, JobSpec

HUGE_TIMEOUT = "1e12"  # accepted once, then every attempt died in RQ with OverflowError


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize("field", ["job_timeout_s", "candidate_timeout_s"])
def test_a_timeout_beyond_a_week_is_not_a_valid_spec(field: str) -> None:
    assert JobSpec.model_validate({"limits": {field: MAX_TIMEOUT_S}}).limits
    with pytest.raises(ValidationError, match=field):
        JobSpec.model_validate({"limits": {field: float(HUGE_TIMEOUT)}})


def test_minify_worker_minify_refuses_a_huge_job_timeout_as_a_usage_error(tmp_path: Path) -> None:
    program = tmp_path / "program.pt2"
    program.write_bytes(b"not read: the spec is refused first")
    result = subprocess.run([sys.executable, "-m", "minify_worker.cli", "minify", str(program),
                             "--job-timeout", HUGE_TIMEOUT, "--out", str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "limits.job_timeout_s" in result.stderr and str(MAX_TIMEOUT_S) in result.stderr
    assert not (tmp_path / "out").exists()


def test_minify_client_submit_refuses_a_huge_job_timeout_before_sending(tmp_path: Path) -> None:
    program = tmp_path / "program.pt2"
    program.write_bytes(b"never sent")
    result = subprocess.run([sys.executable, "-m", "minify_client.cli", "submit", str(program),
                             "--job-timeout", HUGE_TIMEOUT, "--server", closed_port_url()],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "limits.job_timeout_s" in result.stderr
