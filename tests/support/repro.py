"""Running a job's repro.py the way its reader does: `python repro.py` from its folder, in a fresh
process: a fresh interpreter, or, for a repro.py that begins as every fx repro.py does (`import
torch`, `import torch._inductor.config`), a fork of one interpreter per test process that ran those
two lines and nothing else (tests/support/repro_forks.py: ~2 CPU-s of torch's imports paid once,
not per repro), where the environment asked for differs from the one that interpreter started with
only in variables torch's imports never read."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# This process's environment once the test modules were collected (tests/conftest.py's settings in
# it), before any test changed it: what the shared server starts with (tests/conftest.py records
# it; without, the environment of the first repro run).
collected_environment: dict[str, str] | None = None


def run_repro(repro: Path, timeout_s: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `repro` from its folder with this process's environment (the repo root on PYTHONPATH:
    tests/conftest.py puts it there) and `env` over it; its output captured as text."""
    from tests.support.repro_forks import run_shared

    environment = {**os.environ, **env}
    forked = run_shared(repro, environment, collected_environment or environment, timeout_s)
    if forked is not None:
        return forked
    return run_fresh(repro, timeout_s, **env)


def run_fresh(repro: Path, timeout_s: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
    """`run_repro` in a fresh interpreter, always."""
    return subprocess.run([sys.executable, repro.name], cwd=repro.parent, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=timeout_s)


class Repros:
    """A module's `repros` fixture: `run(repro)` is `run_repro(repro, **env)`, through the test
    process's shared server (tests/support/repro_forks.py) like every other repro."""

    def __init__(self, **env: str) -> None:
        self.env = env

    def run(self, repro: Path) -> subprocess.CompletedProcess[str]:
        return run_repro(repro, **self.env)
