"""The version phase's pure parts (minify_worker/service/versions/ranges.py): ordering torch versions,
classifying one run of repro.py, the regression range, the fix, the summary line."""

from __future__ import annotations

import pytest

from minify_contract.models import RegressionRange, VersionOutcome, VersionRun
from minify_worker.service.versions.ranges import (
    VersionError,
    classify,
    fixed_in,
    parse_version,
    regression_range,
    same_signature,
    sort_versions,
    summary,
)

pytestmark = pytest.mark.fast

SIGNATURE = "RuntimeError: injected failure on relu"


def run(torch: str, outcome: str, signature: str | None = None) -> VersionRun:
    return VersionRun(torch=torch, outcome=VersionOutcome(outcome), signature=signature)


def test_releases_order_numerically_not_as_text() -> None:
    assert sort_versions(["2.9.0", "2.14.1", "2.11.0", "2.13.0"]) == ["2.9.0", "2.11.0", "2.13.0", "2.14.1"]


def test_a_nightly_and_an_alpha_build_come_before_their_release_and_after_the_previous_one() -> None:
    assert sort_versions(["2.16.0", "2.16.0.dev20260101+cu128", "2.15.0+cpu", "2.16.0a0+git1234abc",
                          "2.16.0.dev20251201"]) == [
        "2.15.0+cpu", "2.16.0.dev20251201", "2.16.0.dev20260101+cu128", "2.16.0a0+git1234abc", "2.16.0"]


def test_builds_of_one_release_are_kept_apart_by_their_local_label_after_the_plain_release() -> None:
    assert sort_versions(["2.15.0+cu128", "2.15.0", "2.15.0+cpu", "2.15.0+cpu"]) == [
        "2.15.0", "2.15.0+cpu", "2.15.0+cu128"]
    assert parse_version("2.15.0+cpu").public == "2.15.0"
    assert parse_version("2.16.0.dev20260101+cu128").is_nightly
    assert not parse_version("2.15.0+cpu").is_nightly


@pytest.mark.parametrize("text", ["", "torch", "2.x", "latest"])
def test_text_that_is_not_a_version_is_refused(text: str) -> None:
    with pytest.raises(VersionError):
        parse_version(text)


def test_signatures_compare_by_root_type_and_normalized_key() -> None:
    assert same_signature("InductorError: RuntimeError: injected failure on relu", SIGNATURE)
    assert not same_signature("RuntimeError: injected failure on cos", SIGNATURE)
    assert same_signature("SIGSEGV", "SIGSEGV")


def test_a_run_that_prints_repro_passed_and_exits_0_passes() -> None:
    found = classify(0, "repro passed: no failure (inductor on cpu, torch 2.15.0)\n", "", SIGNATURE)
    assert found.outcome is VersionOutcome.passes


def test_a_run_that_fails_with_the_jobs_signature_fails_the_same_way() -> None:
    stderr = f"Traceback ...\nrepro failed with: {SIGNATURE}\nminify expected:   {SIGNATURE}\n"
    found = classify(1, "", stderr, SIGNATURE)
    assert (found.outcome, found.signature) == (VersionOutcome.same, SIGNATURE)


def test_a_run_that_fails_with_another_signature_fails_differently_and_names_it() -> None:
    stderr = "repro failed with: TypeError: unsupported operand\n"
    found = classify(1, "", stderr, SIGNATURE)
    assert (found.outcome, found.signature) == (VersionOutcome.different, "TypeError: unsupported operand")


def test_an_op_the_version_lacks_means_it_cannot_run_the_repro_with_the_reason() -> None:
    stderr = "repro failed with: AttributeError: '_OpNamespace' 'aten' object has no attribute 'new_op'\n"
    found = classify(1, "", stderr, SIGNATURE)
    assert found.outcome is VersionOutcome.cannot_run
    assert "new_op" in found.reason


def test_an_interpreter_without_torch_cannot_run_the_repro() -> None:
    stderr = "Traceback (most recent call last):\n  ...\nModuleNotFoundError: No module named 'torch'\n"
    found = classify(1, "", stderr, SIGNATURE)
    assert found.outcome is VersionOutcome.cannot_run and "No module named 'torch'" in found.reason


def test_a_hang_is_the_same_failure_only_for_a_timeout_bug() -> None:
    assert classify(None, "", "", "TimedOut", timeout_s=30).outcome is VersionOutcome.same
    assert classify(None, "", "", SIGNATURE, timeout_s=30).outcome is VersionOutcome.different


def test_a_crash_compares_by_its_signal() -> None:
    assert classify(-11, "", "", "SIGSEGV", signal_name="SIGSEGV").outcome is VersionOutcome.same
    assert classify(-6, "", "", "SIGSEGV", signal_name="SIGABRT").signature == "SIGABRT"


def test_the_regression_range_is_the_newest_pass_before_the_oldest_same_failure() -> None:
    runs = [run("2.15.0", "same", SIGNATURE), run("2.11.0", "passes"), run("2.14.1", "same", SIGNATURE),
            run("2.13.0", "passes")]
    assert regression_range(runs).range == RegressionRange(last_good="2.13.0", first_bad="2.14.1")


def test_no_range_when_the_oldest_version_fails_too() -> None:
    found = regression_range([run("2.13.0", "same"), run("2.14.1", "same")])
    assert found.range is None and found.reason == "the oldest version tried (2.13.0) fails too"


def test_no_range_when_the_older_versions_fail_otherwise_or_cannot_run() -> None:
    found = regression_range([run("2.11.0", "cannot_run"), run("2.13.0", "different", "TypeError: x"),
                              run("2.14.1", "same")])
    assert found.range is None
    assert found.reason == ("no version older than 2.14.1 passes: 2.11.0 cannot run the repro, "
                            "2.13.0 fails otherwise (TypeError: x)")


def test_no_range_when_nothing_fails_the_same_way() -> None:
    assert regression_range([run("2.13.0", "passes")]).reason == "no version fails the same way"


def test_fixed_in_is_the_oldest_pass_after_the_newest_same_failure() -> None:
    runs = [run("2.11.0", "passes"), run("2.13.0", "same"), run("2.14.1", "different", "TypeError: x"),
            run("2.15.0", "passes"), run("2.16.0.dev20260101", "passes")]
    assert fixed_in(runs) == "2.15.0"


def test_not_fixed_while_the_newest_version_still_fails() -> None:
    assert fixed_in([run("2.13.0", "passes"), run("2.14.1", "same"), run("2.15.0", "same")]) is None


def test_the_summary_line_says_where_it_fails_passes_and_the_range() -> None:
    runs = [run("2.15.0", "same"), run("2.14.1", "same"), run("2.13.0", "passes")]
    assert summary(runs) == "fails on 2.14.1, 2.15.0; passes on 2.13.0: regression in (2.13.0, 2.14.1]"


def test_the_summary_line_names_the_fix_and_the_inconclusive_versions() -> None:
    runs = [run("2.11.0", "cannot_run"), run("2.13.0", "same"), run("2.14.1", "passes"),
            run("2.12.0", "different", "TypeError: x")]
    assert summary(runs) == ("fails on 2.13.0; passes on 2.14.1; fails otherwise on 2.12.0 (TypeError: x); "
                             "cannot run on 2.11.0: no regression range (no version older than 2.13.0 passes: "
                             "2.11.0 cannot run the repro, 2.12.0 fails otherwise (TypeError: x)); fixed in 2.14.1")


def test_a_probe_nobody_answered_is_not_kept_on_the_bug_but_every_run_is() -> None:
    from minify_worker.service.versions.bugs import ran

    unanswered = VersionRun(torch="2.15.0", outcome=VersionOutcome.cannot_run,
                            reason="no worker holding it answered in time")
    lacking = VersionRun(torch="2.11.0", outcome=VersionOutcome.cannot_run, reason="no attribute", seconds=2.5)
    own = VersionRun(torch="2.13.0", outcome=VersionOutcome.same, reason="the job's own run of the minimal program")

    assert [ran(run) for run in (unanswered, lacking, own)] == [False, True, True]


def test_with_one_torch_version_the_summary_tells_no_range_and_repro_py_gets_no_versions_line() -> None:
    from minify_contract.models import JobState, Report
    from minify_worker.service.versions.phase import header_lines, with_versions

    alone = [VersionRun(torch="2.13.0+cpu", outcome=VersionOutcome.same, seconds=1.0)]
    report = with_versions(Report(status=JobState.succeeded, backend="inductor", device="cpu"), alone)
    compared = with_versions(report, [*alone, VersionRun(torch="2.14.1", outcome=VersionOutcome.passes, seconds=1.0)])

    assert summary(alone) == "fails on 2.13.0+cpu (the only torch version tried)"
    assert not report.versions_compared and header_lines(report) == []
    assert compared.versions_compared
    assert header_lines(compared)[0] == ("Torch versions:   fails on 2.13.0+cpu; passes on 2.14.1: no regression range "
                                         "(the oldest version tried (2.13.0+cpu) fails too); fixed in 2.14.1")
