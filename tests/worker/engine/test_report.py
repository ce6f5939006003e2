"""report.json from a run's facts (report.py): a pure function, tested on an FX graph built here."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx

from minify_contract.bugs import bug_key
from minify_contract.models import JobSpec, JobState, OriginalState, Report
from minify_worker.engine.report import RunFacts, after_verdict, build_report
from minify_worker.engine.scheduler import Stats
from minify_worker.outcomes import Signature
from minify_worker.programs import representation
from minify_worker.programs.fx import graph as g

pytestmark = pytest.mark.fast

RELU = Signature(kind="compile_error", exc_type="RuntimeError", key="injected failure on relu",
                 text="RuntimeError: injected failure on relu", chain=("InductorError", "RuntimeError"))
NO_CULPRIT = {"culprit_state": "skipped"}


def relu_graph() -> fx.Graph:
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta[g.META_KIND] = "tensor"
    x.meta[g.META_TENSOR] = {"shape": [2, 3], "dtype": "float32"}
    graph.output((graph.call_function(torch.ops.aten.relu.default, (x,)),))
    return graph


def facts(**values: object) -> RunFacts:
    return RunFacts(JobSpec(), representation("fx"), "2.13.0", **values)  # type: ignore[arg-type]


def test_a_result_describes_its_minimal_program_and_files_it_under_a_bug() -> None:
    graph = relu_graph()
    report = build_report(JobState.succeeded, None, facts(best=graph, nodes_original=7, signature=RELU,
                                                         original_runs=3, original_failures=3),
                          stats=Stats(checks_total=12, checks_cached=2), elapsed_s=1.23456,
                          culprit_fields=NO_CULPRIT)

    assert (report.nodes_original, report.nodes_final, report.checks_total) == (7, 1, 12)
    assert report.signature == str(RELU) and report.failure_kind == "compile_error"
    assert report.signature_chain == ["InductorError", "RuntimeError"]
    assert "relu" in (report.graph_code or "")
    assert report.input_shapes_final["x"].shape == [2, 3]
    assert report.bug == bug_key(str(RELU), report.graph_shape_hash or "")
    assert report.elapsed_s == 1.235 and report.reason is None


def test_a_flaky_original_warns_that_the_result_may_not_be_minimal() -> None:
    report = build_report(JobState.succeeded, None, facts(best=relu_graph(), signature=RELU, flaky=True,
                                                         original_runs=3, original_failures=2),
                          stats=None, elapsed_s=1.0, culprit_fields=NO_CULPRIT)

    assert "failed in 2 of 3 runs" in (report.reason or "") and "may not be minimal" in (report.reason or "")


def test_a_job_that_did_not_succeed_describes_no_program_and_files_no_bug() -> None:
    report = build_report(JobState.not_reproducible, "it passed", facts(best=relu_graph(), nodes_original=1),
                          stats=None, elapsed_s=1.0, culprit_fields=NO_CULPRIT, seen=RELU)

    assert report.nodes_final is None and report.graph_code is None and report.bug is None
    assert report.input_shapes_final == {}
    assert report.signature is None and report.signature_chain == ["InductorError", "RuntimeError"]  # what it saw


# -- the original's verdict after a delivered result (deliver first, confirm after) --------------


def delivered(reason: str | None = None) -> Report:
    return build_report(JobState.succeeded, reason, facts(best=relu_graph(), signature=RELU,
                                                          original_state=OriginalState.running),
                        stats=None, elapsed_s=1.0, culprit_fields=NO_CULPRIT)


def test_a_verdict_that_confirms_the_result_changes_only_the_originals_fields() -> None:
    before = delivered()
    after = after_verdict(before, facts(best=relu_graph(), signature=RELU, original_state=OriginalState.confirmed,
                                        original_compiles=1, original_runs=1, original_failures=1,
                                        phase_s={"original": 2.5}))

    assert before.original_state is OriginalState.running and before.original_runs == 0
    assert after.original_state is OriginalState.confirmed and after.original_runs == 1 and after.reason is None
    assert after.phase_s == {"original": 2.5}
    assert after.model_dump(exclude={"original_state", "original_compiles", "original_runs", "original_failures",
                                     "phase_s"}) == before.model_dump(exclude={
                                         "original_state", "original_compiles", "original_runs",
                                         "original_failures", "phase_s"})


def test_a_flaky_original_confirmed_after_the_result_warns_as_one_confirmed_before() -> None:
    after = after_verdict(delivered(), facts(best=relu_graph(), signature=RELU, flaky=True, original_runs=3,
                                             original_failures=2, original_state=OriginalState.confirmed))

    assert after.flaky and "failed in 2 of 3 runs" in (after.reason or "")


@pytest.mark.parametrize("delivered_reason", [None, "job timeout of 60s reached"])
def test_a_verdict_that_contradicts_the_result_keeps_it_and_says_so_plainly(delivered_reason: str | None) -> None:
    verdict = "the original program did not fail on backend inductor (cpu): passes 3x"
    after = after_verdict(delivered(delivered_reason), facts(
        best=relu_graph(), signature=RELU, original_state=OriginalState.not_reproduced, original_verdict=verdict))

    assert after.status is JobState.succeeded and after.graph_code == delivered().graph_code
    assert after.original_verdict == verdict
    assert f"the result is kept, though the original's verdict contradicts it: {verdict}" in (after.reason or "")
    assert f"the minimal program fails with {RELU}" in (after.reason or "")
    assert (after.reason or "").startswith(delivered_reason or "the result is kept")


def test_a_result_reduced_past_a_contradicting_verdict_says_so_when_delivered() -> None:
    report = build_report(JobState.succeeded, None, facts(
        best=relu_graph(), signature=RELU, original_state=OriginalState.not_reproduced, original_verdict="passes 3x"),
        stats=None, elapsed_s=1.0, culprit_fields=NO_CULPRIT)

    assert report.original_state is OriginalState.not_reproduced
    assert "the original's verdict contradicts it: passes 3x" in (report.reason or "")
