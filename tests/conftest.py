"""Fixtures shared by the test modules."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The example programs relu_cos and chain, saved as .pt2 once per test module."""
    from examples.programs import save

    directory = tmp_path_factory.mktemp("programs")
    return {name: save(name, directory) for name in ("relu_cos", "chain")}
