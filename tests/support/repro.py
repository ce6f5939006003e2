"""Running a job's repro.py the way its reader does: `python repro.py` from its folder, in a fresh
process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_repro(repro: Path, timeout_s: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `repro` from its folder with this process's environment (the repo root on PYTHONPATH:
    tests/conftest.py puts it there) and `env` over it; its output captured as text."""
    return subprocess.run([sys.executable, repro.name], cwd=repro.parent, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=timeout_s)
