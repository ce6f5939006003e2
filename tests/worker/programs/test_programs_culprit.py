"""What a culprit phase found, as the job says it (programs/culprit.py): report.json's culprit fields
and repro.py's header lines, for every state of the phase, whatever the representation. Values
only; the phase itself (torch's compiler bisector, probes in children) is in test_culprit.py."""

from __future__ import annotations

import pytest

from minify_contract.models import Culprit, CulpritState, JobSpec, JobState, Report, Workaround
from minify_worker.programs import culprit
from minify_worker.programs.culprit import Found

pytestmark = pytest.mark.fast

RELU = Culprit(backend="inductor", subsystem="lowerings", bisect_number=0, detail="relu")
AOT_EAGER = Workaround(setting="backend", value="aot_eager", verified_on="original program: compiles and runs")


def as_report(fields: dict[str, object]) -> Report:
    """The fields as report.json takes them (they must validate)."""
    return Report(status=JobState.succeeded, backend="inductor", device="cpu", **fields)  # type: ignore[arg-type]


def test_a_phase_that_found_a_culprit_reports_it_its_workarounds_and_what_it_tried() -> None:
    found = Found(culprit=RELU, reason="fails from lowering #0", workarounds=[AOT_EAGER],
                  tried={"backend=aot_eager": "passes"})

    report = as_report(culprit.report_fields(found, JobSpec()))

    assert report.culprit_state is CulpritState.done and report.culprit == RELU
    assert report.culprit_reason == "fails from lowering #0"
    assert report.workarounds == [AOT_EAGER] and report.workarounds_tried == {"backend=aot_eager": "passes"}


def test_a_phase_that_did_not_run_says_why() -> None:
    not_asked = culprit.report_fields(None, JobSpec(culprit=False))
    no_phase = culprit.report_fields(None, JobSpec.model_validate({"program_format": "stablehlo", "backend": "xla"}),
                                     has_phase=False)
    cut_short = culprit.report_fields(None, JobSpec())

    assert {fields["culprit_state"] for fields in (not_asked, no_phase, cut_short)} == {CulpritState.skipped}
    assert not_asked["culprit_reason"] == "not asked for (spec culprit: false)"
    assert no_phase["culprit_reason"].startswith("none for stablehlo programs")
    assert cut_short["culprit_reason"] == "not run: the job ended before the culprit phase"
    for fields in (not_asked, no_phase, cut_short):
        as_report(fields)
        assert (fields["culprit"], fields["workarounds"], fields["workarounds_tried"]) == (None, [], {})


def test_the_result_delivered_before_the_phase_says_it_is_running() -> None:
    report = as_report(culprit.pending_fields())

    assert report.culprit_state is CulpritState.running and report.culprit is None
    assert report.culprit_reason == culprit.PENDING_REASON


def test_a_phase_that_stopped_says_how_and_why() -> None:
    fields = culprit.stopped_fields(CulpritState.cancelled, "the job was cancelled")

    assert as_report(fields).culprit_state is CulpritState.cancelled
    assert fields["culprit_reason"] == "the job was cancelled" and fields["culprit"] is None


def test_repro_py_says_the_culprit_pending_while_the_phase_runs_and_none_when_it_stopped() -> None:
    assert culprit.pending_header_lines() == [
        f"Culprit:          {culprit.PENDING_REASON} (report.json has it once done)"]
    assert culprit.stopped_header_lines("lost with its worker") == ["Culprit:          none: lost with its worker"]


def test_repro_py_names_the_culprit_with_its_reason_and_each_workaround() -> None:
    lines = culprit.header_lines(Found(culprit=RELU, reason="fails from lowering #0", workarounds=[AOT_EAGER]))

    assert lines == [
        "Culprit:          inductor / lowerings #0: relu (torch's compiler bisector, on this program)",
        "                  fails from lowering #0",
        "Workaround:       backend='aot_eager' (original program: compiles and runs)"]


def test_repro_py_says_when_no_culprit_and_no_workaround_were_found() -> None:
    assert culprit.header_lines(Found(reason="no stage fails alone")) == [
        "Culprit:          none: no stage fails alone", "Workarounds:      none verified"]
    assert culprit.header_lines(None) == []  # no phase, no lines
