"""The culprit phase (worker/minify_worker/programs/fx/culprit/): which compiler stage is to blame, found by
torch's compiler bisector on the minimal program with every probe in a sandbox child, and which
settings avoid the bug, verified on the original program.

The custom-backend tests are cheap (no compiler); the inductor ones compile for real, one job each.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from examples import programs
from minify_contract.models import Culprit, CulpritState, JobSpec, JobState, Report, Workaround
from minify_contract.specflags import add_spec_arguments, spec_from_args
from minify_contract.summaries import culprit_summary
from minify_worker.engine import MinifyResult, minify
from minify_worker.programs.fx import culprit
from minify_worker.programs.fx.backends import ALLOWED_BACKENDS_ENV
from minify_worker.sandbox.warmup import compile_cache_dir
from tests.support.backends import PREFIX

PATTERN_MATCHER_BUG = f"{PREFIX}:fail_on_relu_unless_pattern_matcher_off"
RELU_BUG = {"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}


def run(directory: Path, builder: str, *, ops: tuple[str, ...] = (), **spec: object) -> MinifyResult:
    ep, _ = programs.chain(ops) if ops else programs.BUILDERS[builder]()
    directory.mkdir(parents=True, exist_ok=True)
    program = directory / f"{builder}.pt2"
    torch.export.save(ep, program)
    return minify(program, JobSpec.model_validate(spec), directory / "out")


@pytest.fixture(scope="module")
def generous_budget() -> Iterator[None]:
    """The box running the tests is shared: a phase cut short by its time budget would make the
    results depend on the load, so these jobs get minutes."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(culprit.MIN_BUDGET_ENV, "300")
        patch.setenv(ALLOWED_BACKENDS_ENV, PREFIX)
        yield


def test_the_budget_is_a_share_of_the_job_above_the_floor_or_the_one_the_operator_sets(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(culprit.MIN_BUDGET_ENV, "5")
    monkeypatch.delenv(culprit.BUDGET_ENV, raising=False)
    assert culprit.budget_s(10.0) == 5.0 and culprit.budget_s(100.0) == 100.0 * culprit.BUDGET_FRACTION

    monkeypatch.setenv(culprit.BUDGET_ENV, "3")
    assert culprit.budget_s(10.0) == culprit.budget_s(100.0) == 3.0


@pytest.fixture(scope="module")
def pattern_matcher_job(tmp_path_factory: pytest.TempPathFactory, generous_budget: None) -> MinifyResult:
    return run(tmp_path_factory.mktemp("pattern_matcher"), "relu_cos", backend=PATTERN_MATCHER_BUG)


def test_the_one_setting_that_avoids_the_bug_is_the_workaround_verified_on_the_original(
        pattern_matcher_job: MinifyResult) -> None:
    report = pattern_matcher_job.report

    assert pattern_matcher_job.status is JobState.succeeded, pattern_matcher_job.reason
    assert report.workarounds == [Workaround(setting="pattern_matcher", value=False,
                                             verified_on="original program: compiles and runs")]
    assert "culprit" in report.phase_s


def test_a_probe_that_segfaults_costs_that_probe(pattern_matcher_job: MinifyResult) -> None:
    tried = pattern_matcher_job.report.workarounds_tried

    assert "crashed" in tried["freezing=True"] and "SIGSEGV" in tried["freezing=True"]
    assert tried["cpp_wrapper=True"].startswith("minimal program: fails")  # the probes after it ran
    assert pattern_matcher_job.report.workarounds  # and the phase went on to verify the workaround


def test_a_custom_backend_has_no_stages_to_bisect(pattern_matcher_job: MinifyResult) -> None:
    report = pattern_matcher_job.report

    assert report.culprit is None
    assert "no stages" in (report.culprit_reason or "") and PATTERN_MATCHER_BUG in (report.culprit_reason or "")


def test_the_result_is_delivered_before_the_culprit_phase_which_then_rewrites_it(
        tmp_path: Path, generous_budget: None) -> None:
    seen: dict[str, object] = {}

    def delivered(result: MinifyResult) -> None:
        seen["report"] = result.report
        seen["report.json"] = json.loads((tmp_path / "out" / "report.json").read_text())
        seen["repro.py"] = (tmp_path / "out" / "repro.py").read_text()

    ep, _ = programs.BUILDERS["relu_cos"]()
    torch.export.save(ep, tmp_path / "relu_cos.pt2")
    final = minify(tmp_path / "relu_cos.pt2", JobSpec(backend=f"{PREFIX}:fail_on_relu"),
                   tmp_path / "out", on_result=delivered)

    early = seen["report"]
    assert isinstance(early, Report) and early.status is JobState.succeeded
    assert early.culprit_state is CulpritState.running and "culprit" not in early.phase_s
    assert seen["report.json"]["culprit_state"] == "running"  # type: ignore[index]
    assert "# Culprit:          pending" in str(seen["repro.py"])
    assert final.status is JobState.succeeded and final.report.culprit_state is CulpritState.done
    assert "culprit" in final.report.phase_s and final.report.elapsed_s == early.elapsed_s
    assert json.loads((tmp_path / "out" / "report.json").read_text())["culprit_state"] == "done"
    assert "pending" not in (tmp_path / "out" / "repro.py").read_text()


def test_a_bug_no_setting_avoids_has_no_workarounds(tmp_path: Path, generous_budget: None) -> None:
    result = run(tmp_path, "relu_cos", backend=f"{PREFIX}:fail_on_relu")

    assert result.status is JobState.succeeded, result.reason
    written = json.loads((tmp_path / "out" / "report.json").read_text())
    assert written["workarounds"] == []
    assert set(written["workarounds_tried"]) == {f"{key}={value}" for key, value in culprit.settings(
        JobSpec(backend=f"{PREFIX}:fail_on_relu"))}
    assert all(outcome.startswith("minimal program: fails") for outcome in written["workarounds_tried"].values())


def test_spec_culprit_false_skips_the_phase(tmp_path: Path, generous_budget: None) -> None:
    result = run(tmp_path, "relu_cos", backend=PATTERN_MATCHER_BUG, culprit=False)

    assert result.status is JobState.succeeded, result.reason
    assert "culprit" not in result.report.phase_s
    assert result.report.culprit_state is CulpritState.skipped
    assert result.report.culprit is None and result.report.workarounds == []
    assert result.report.culprit_reason == "not asked for (spec culprit: false)"


def test_settings_fit_the_backend() -> None:
    inductor = dict(culprit.settings(JobSpec(backend="inductor")))
    aoti = dict(culprit.settings(JobSpec(backend="aot_inductor")))

    assert inductor["backend"] == "aot_eager" and inductor["fallback_random"] is True
    assert "backend" not in aoti and "cpp_wrapper" not in aoti  # an AOTI package always has a C++ wrapper
    assert culprit.settings(JobSpec(backend="eager")) == []
    # A setting the job already has is no workaround.
    assert "pattern_matcher" not in dict(culprit.settings(JobSpec(config={"pattern_matcher": False})))


def test_no_culprit_flag_turns_the_phase_off_in_the_spec() -> None:
    parser = argparse.ArgumentParser()
    add_spec_arguments(parser)

    assert spec_from_args(parser.parse_args(["--no-culprit"])).culprit is False
    assert spec_from_args(parser.parse_args([])).culprit is True


def test_summary_line_and_repro_header_say_culprit_and_workarounds() -> None:
    found = culprit.Found(
        culprit=Culprit(backend="inductor", subsystem="lowerings", bisect_number=0, detail="relu"),
        workarounds=[Workaround(setting="backend", value="aot_eager",
                                verified_on="original program: compiles and runs")])
    report = Report(status=JobState.succeeded, backend="inductor", device="cpu",
                    **culprit.report_fields(found, JobSpec()))
    nothing = Report(status=JobState.succeeded, backend="x:y", device="cpu",
                     **culprit.report_fields(culprit.Found(reason="no stages"), JobSpec()))

    assert culprit_summary(report) == "culprit: inductor / lowerings #0: relu; workarounds: backend='aot_eager'"
    assert culprit_summary(nothing) == "culprit: none (no stages); workarounds: none verified"
    assert culprit.header_lines(found) == [
        "Culprit:          inductor / lowerings #0: relu (torch's compiler bisector, on this program)",
        "Workaround:       backend='aot_eager' (original program: compiles and runs)"]


# -- real inductor ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def relu_job(tmp_path_factory: pytest.TempPathFactory, generous_budget: None) -> MinifyResult:
    return run(tmp_path_factory.mktemp("relu"), "relu_cos", config=RELU_BUG)


@pytest.mark.inductor
def test_relu_compile_error_is_blamed_on_inductors_relu_lowering(relu_job: MinifyResult) -> None:
    found = relu_job.report.culprit

    assert relu_job.status is JobState.succeeded, relu_job.reason
    assert found is not None, relu_job.report.culprit_reason
    assert (found.backend, found.subsystem, found.bisect_number, found.detail) == ("inductor", "lowerings", 0, "relu")
    assert found.graph == "forward"  # compiled under no_grad: the only graph there is
    assert found.notes == []


@pytest.mark.inductor
def test_probes_the_job_already_answered_are_not_run_again(relu_job: MinifyResult) -> None:
    tried = relu_job.report.workarounds_tried

    # On CPU inductor turns comprehensive padding off itself: the job's own run answered it.
    assert "known without a probe" in tried["comprehensive_padding=False"]
    assert "known without a probe" in tried["layout_optimization=False"]  # relu has no convolution
    assert relu_job.report.culprit is not None and relu_job.report.culprit.probes <= 17


@pytest.mark.inductor
def test_falling_back_to_aot_eager_is_verified_for_an_inductor_bug(relu_job: MinifyResult) -> None:
    assert [(w.setting, w.value) for w in relu_job.report.workarounds] == [("backend", "aot_eager")]


@pytest.mark.inductor
def test_repro_header_names_the_culprit_and_the_workaround(relu_job: MinifyResult) -> None:
    header = [line for line in relu_job.artifacts["repro.py"].read_text().splitlines() if line.startswith("#")]

    assert any(line.startswith("# Culprit:") and "inductor / lowerings #0: relu" in line for line in header)
    assert any(line.startswith("# Workaround:") and "backend='aot_eager'" in line for line in header)


@pytest.mark.inductor
def test_a_job_after_the_culprit_phase_compiles_as_if_none_had_run(relu_job: MinifyResult, tmp_path: Path) -> None:
    from torch._inductor.compiler_bisector import CompilerBisector

    # The bisector's state lived in the job's work dir: nothing in the compile caches jobs share
    # (a stale bisect_status.txt there turns bisection on in every later compile: pytorch#143453),
    # and this process's bisector is off again.
    assert not (compile_cache_dir(tmp_path) / "inductor" / "bisect").exists()
    assert (CompilerBisector.bisection_enabled, CompilerBisector.in_process_cache) == (False, None)
    # A later job's compiles still lower relu (with lowerings disabled it would not reproduce).
    later = run(tmp_path, "relu_cos", config=RELU_BUG, culprit=False)
    assert later.status is JobState.succeeded, later.reason
    assert later.report.signature == relu_job.report.signature


@pytest.mark.inductor
def test_log1p_accuracy_bug_is_blamed_on_a_lowering_of_log1p(tmp_path: Path, generous_budget: None) -> None:
    # inductor's injected log1p bug accepts "accuracy" only (log1p(x) computed as x + 1).
    result = run(tmp_path, "chain", ops=("sin", "log1p", "cos"), failure={"kind": "accuracy"},
                 config={"cpp.inject_log1p_bug_TESTING_ONLY": "accuracy"})
    found = result.report.culprit

    assert result.status is JobState.succeeded, result.reason
    assert found is not None, result.report.culprit_reason
    assert (found.backend, found.subsystem, found.detail) == ("inductor", "lowerings", "log1p")
