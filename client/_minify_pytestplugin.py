"""minify's pytest plugin, as registered (the `pytest11` entry point of the minify distribution).

A top-level module outside the package, as Hypothesis's `_hypothesis_pytestplugin.py`: every
pytest run in an environment with minify installed loads it, so it imports nothing but `os` until
capture is switched on with `MINIFY_CAPTURE_DIR=DIR` or `MINIFY_CAPTURE=1`; then
`minify_client.pytest_plugin` does the work (`-p minify_client.pytest_plugin` switches it on too).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest


def capture_requested() -> bool:
    return bool(os.environ.get("MINIFY_CAPTURE_DIR")) or os.environ.get("MINIFY_CAPTURE") == "1"


def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """MINIFY_CAPTURE_CRASH=1 or MINIFY_CAPTURE_HANG=SECONDS: the run supervised, so a crash in
    compiled code, or a compile that hangs, leaves its capture."""
    supervised = os.environ.get("MINIFY_CAPTURE_CRASH") == "1" or os.environ.get("MINIFY_CAPTURE_HANG", "").strip()
    if capture_requested() and supervised:
        from minify_client.pytest_plugin import supervise

        return supervise(config)
    return None


def pytest_configure(config: pytest.Config) -> None:
    if capture_requested():
        from minify_client.pytest_plugin import register

        register(config)
