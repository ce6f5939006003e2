"""minify_worker.allowlist: the prefixes an operator allows, read once for backends and op modules."""

from __future__ import annotations

import subprocess
import sys

import pytest

from minify_worker.allowlist import allowed_prefixes


@pytest.mark.fast
def test_the_prefixes_are_the_comma_separated_entries_without_spaces() -> None:
    assert allowed_prefixes("ALLOWED", {"ALLOWED": " pkg.backends , tests.support,other"}) == \
        ["pkg.backends", "tests.support", "other"]


@pytest.mark.fast
def test_empty_entries_are_dropped() -> None:
    assert allowed_prefixes("ALLOWED", {"ALLOWED": ",pkg,, ,"}) == ["pkg"]


@pytest.mark.fast
def test_an_unset_variable_allows_nothing() -> None:
    assert allowed_prefixes("ALLOWED", {}) == []


@pytest.mark.fast
def test_the_environment_is_read_at_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINIFY_TEST_ALLOWED", "first")
    assert allowed_prefixes("MINIFY_TEST_ALLOWED") == ["first"]
    monkeypatch.setenv("MINIFY_TEST_ALLOWED", "second")
    assert allowed_prefixes("MINIFY_TEST_ALLOWED") == ["second"]


def test_reading_the_allowlist_does_not_import_torch() -> None:
    # op_modules reads it in a spawned fork server before torch is imported.
    script = "import sys, minify_worker.allowlist, minify_worker.programs.fx.op_modules; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
