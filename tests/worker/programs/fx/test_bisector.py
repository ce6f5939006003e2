"""The adapter around torch's CompilerBisector (worker/minify_worker/programs/fx/bisector.py), without compiling:
the probes are answered by a function."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from minify_worker.programs.fx import bisector


@pytest.mark.fast
def test_a_bisection_ended_by_an_error_prints_nothing_on_stdout(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    # torch's cleanup prints "Bisection status deleted." when do_bisect's frame dies, which on an
    # error is after do_bisect returned: it once broke `minify-worker minify --json`.
    def cancelled(probe: bisector.Probe) -> bool:
        raise RuntimeError("cancelled")

    with pytest.raises(RuntimeError, match="cancelled"):
        bisector.bisect(cancelled, tmp_path / "bisect")

    assert capfd.readouterr().out == ""
    assert not (tmp_path / "bisect").exists()


@pytest.mark.fast
def test_a_bisection_that_finds_the_first_failing_stage_prints_nothing_on_stdout(
    tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    found = bisector.bisect(lambda probe: probe.backend == "eager", tmp_path / "bisect")

    assert found is not None and found.backend == "aot_eager"
    assert capfd.readouterr().out == ""


def _lowerings_in_a_child(probe: bisector.Probe, state_dir: Path, answer: Any) -> None:
    """What a probe's child does, less the compile: inductor asks the bisector before each lowering
    (`disable_subsystem("inductor", "lowerings", debug_info)`); the program fails while relu's runs."""
    from torch._inductor.compiler_bisector import CompilerBisector

    bisector.enter_probe(probe.environment(), state_dir)
    disabled = {op: CompilerBisector.disable_subsystem("inductor", "lowerings", lambda op=op: op)
                for op in ("sin", "relu", "cos")}
    answer.put(probe.backend != "inductor" or disabled["relu"])


def test_the_op_a_bisection_ends_on_comes_back_from_the_probes_child(tmp_path: Path) -> None:
    # torch 2.11 and 2.12 keep the debug info (which lowering: relu) in the memory of the process
    # that lowered, the probe's child, where the bisecting process never saw it: "lowerings #1"
    # with no op. On 2.13 and newer torch keeps it in the state files itself.
    context = multiprocessing.get_context("fork")

    def works(probe: bisector.Probe) -> bool:
        answer = context.Queue()
        child = context.Process(target=_lowerings_in_a_child, args=(probe, tmp_path / "bisect", answer))
        child.start()
        works = answer.get(timeout=60)
        child.join()
        return works

    found = bisector.bisect(works, tmp_path / "bisect")

    assert found == bisector.Result("inductor", "lowerings", 1, "relu")


DEFAULTS = {"triton.cudagraphs": False, "disable_padding_cpu": True, "force_layout_optimization": False}


def same(probe: bisector.Probe, *, device_class: str = "cpu", has_convolution: bool = False,
         **settings: object) -> str | None:
    values = {**DEFAULTS, **{key.replace("__", "."): value for key, value in settings.items()}}
    return bisector.same_as_last_stage(probe, device_class=device_class, has_convolution=has_convolution,
                                       setting=values.__getitem__)


@pytest.mark.fast
def test_probes_that_compile_what_the_last_stage_compiles_are_named_with_why() -> None:
    cudagraphs = bisector.Probe("inductor", "cudagraphs", "test_disable")
    padding = bisector.Probe("inductor", "inductor_comprehensive_padding", "test_disable",
                             (("comprehensive_padding", False),))
    layout = bisector.Probe("inductor", "inductor_layout_optimization", "test_disable",
                            (("layout_optimization", False),))

    assert "cudagraphs are off" in (same(cudagraphs) or "")
    assert "on CPU" in (same(padding) or "")
    assert "no convolution" in (same(layout) or "")


@pytest.mark.fast
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
