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


DEFAULTS = {"triton.cudagraphs": False, "disable_padding_cpu": True, "force_layout_optimization": False}


def same(probe: bisector.Probe, *, device_class: str = "cpu", has_convolution: bool = False,
         **settings: object) -> str | None:
    values = {**DEFAULTS, **{key.replace("__", "."): value for key, value in settings.items()}}
    return bisector.same_as_last_stage(probe, device_class=device_class, has_convolution=has_convolution,
                                       setting=values.__getitem__)


def test_probes_that_compile_what_the_last_stage_compiles_are_named_with_why() -> None:
    cudagraphs = bisector.Probe("inductor", "cudagraphs", "test_disable")
    padding = bisector.Probe("inductor", "inductor_comprehensive_padding", "test_disable",
                             (("comprehensive_padding", False),))
    layout = bisector.Probe("inductor", "inductor_layout_optimization", "test_disable",
                            (("layout_optimization", False),))

    assert "cudagraphs are off" in (same(cudagraphs) or "")
    assert "on CPU" in (same(padding) or "")
    assert "no convolution" in (same(layout) or "")


def test_probes_that_may_compile_otherwise_are_run() -> None:
    cudagraphs = bisector.Probe("inductor", "cudagraphs", "test_disable")
    padding = bisector.Probe("inductor", "inductor_comprehensive_padding", "test_disable",
                             (("comprehensive_padding", False),))
    layout = bisector.Probe("inductor", "inductor_layout_optimization", "test_disable",
                            (("layout_optimization", False),))

    assert same(cudagraphs, triton__cudagraphs=True) is None
    assert same(padding, device_class="cuda") is None and same(padding, disable_padding_cpu=False) is None
    assert same(layout, has_convolution=True) is None and same(layout, force_layout_optimization=True) is None
    assert same(bisector.Probe("inductor", "lowerings", "test_disable")) is None
    assert same(bisector.Probe("aot_eager")) is None
