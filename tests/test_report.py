"""report.json from a run's facts (report.py): a pure function, tested on an FX graph built here."""

from __future__ import annotations

import torch
import torch.fx as fx

from minify_client.bugs import bug_key
from minify_client.models import JobSpec, JobState
from minify_worker import graph as g
from minify_worker.outcomes import Signature
from minify_worker.programs import representation
from minify_worker.report import RunFacts, build_report
from minify_worker.scheduler import Stats

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
