"""Running minify's commands as a user's child process would: the repository importable, and none
of this test run's MINIFY_* or PYTEST_* settings leaking into the child."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent


def clean_environment(**extra: str) -> dict[str, str]:
    environment = {key: value for key, value in os.environ.items() if not key.startswith(("MINIFY_", "PYTEST_"))}
    environment["PYTHONPATH"] = str(REPO)
    environment.update(extra)
    return environment


def run_clean(command: list[str], cwd: Path, *, timeout_s: float, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, env=clean_environment(**extra), capture_output=True, text=True,
                          timeout=timeout_s)
