"""The adapter around torch's CompilerBisector (worker/minify_worker/bisector.py), without compiling:
the probes are answered by a function."""

from __future__ import annotations

from pathlib import Path

import pytest

from minify_worker import bisector


def test_a_bisection_ended_by_an_error_prints_nothing_on_stdout(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    # torch's cleanup prints "Bisection status deleted." when do_bisect's frame dies, which on an
    # error is after do_bisect returned: it once broke `minify-worker minify --json`.
    def cancelled(probe: bisector.Probe) -> bool:
        raise RuntimeError("cancelled")

    with pytest.raises(RuntimeError, match="cancelled"):
        bisector.bisect(cancelled, tmp_path / "bisect")

    assert capfd.readouterr().out == ""
    assert not (tmp_path / "bisect").exists()


def test_a_bisection_that_finds_the_first_failing_stage_prints_nothing_on_stdout(
    tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    found = bisector.bisect(lambda probe: probe.backend == "eager", tmp_path / "bisect")

    assert found is not None and found.backend == "aot_eager"
    assert capfd.readouterr().out == ""
