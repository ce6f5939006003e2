"""A run's progress (engine/progress.py): the phase clock, the timeline and the events a subscriber
gets, over made-up facts and a program that is a list of op names: no sandbox, no compile. What a
whole job emits is in test_engine.py and test_client_progress.py."""

from __future__ import annotations

import time
from typing import Any

import pytest

from minify_contract.models import CulpritState, JobSpec, JobState, Milestone, ProgressEvent
from minify_worker.engine import progress as progress_module
from minify_worker.engine.progress import Progress
from minify_worker.engine.report import RunFacts
from minify_worker.engine.scheduler import Stats
from minify_worker.outcomes import Signature

pytestmark = pytest.mark.fast


class ListProgram:
    """A representation whose programs are lists of op names (only what Progress asks of one)."""

    def count_ops(self, program: list[str]) -> int:
        return len(program)

    def code(self, program: list[str]) -> str:
        return " -> ".join(program)


def progress(events: list[ProgressEvent] | None = None, **facts: Any) -> Progress:
    run_facts = RunFacts(spec=JobSpec(), program=ListProgram(), torch_version="2.13.0", **facts)  # type: ignore[arg-type]
    return Progress(run_facts, events.append if events is not None else None)


def test_each_phase_s_clock_adds_up_the_time_spent_in_that_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: now[0])
    run = progress()

    now[0] = 101.0
    run.enter("reduce")
    now[0] = 104.0
    run.enter("shrink")
    now[0] = 104.5
    run.enter("reduce")
    now[0] = 106.5
    run.enter("culprit")

    assert run.facts.phase_s == {"prepare": 1.0, "reduce": 5.0, "shrink": 0.5}
    assert run.phase == "culprit"


def test_a_step_is_always_told_with_its_milestone() -> None:
    events: list[ProgressEvent] = []
    run = progress(events)

    run.say(Milestone.original_started, "running the original")
    run.say(Milestone.reproduced, "reproduced")

    assert [(e.milestone, e.message, e.type) for e in events] == [
        (Milestone.original_started, "running the original", "progress"),
        (Milestone.reproduced, "reproduced", "progress")]


def test_periodic_progress_is_sent_at_most_every_interval() -> None:
    events: list[ProgressEvent] = []
    run = progress(events)

    run.emit()
    run.emit()  # within the interval: dropped
    run.say(Milestone.reproduced, "a step is never dropped")
    assert len(events) == 2

    time.sleep(progress_module.EVENT_INTERVAL_S + 0.05)
    run.emit()
    assert len(events) == 3


def test_an_event_carries_the_counts_the_signature_and_the_accepted_programs_code() -> None:
    events: list[ProgressEvent] = []
    signature = Signature(kind="compile_error", exc_type="RuntimeError", key="relu", text="RuntimeError: relu")
    run = progress(events, nodes_original=5, best=["relu", "cos"], signature=signature)
    run.stats = Stats(checks_total=7, checks_cached=2, checks_in_flight=1, strategy="drop")
    run.stats.outcomes["passes"] = 4
    run.enter("reduce")

    run.emit(force=True, graph=["relu"])

    event = events[-1]
    assert (event.nodes_original, event.nodes_current) == (5, 2)
    assert (event.checks_total, event.checks_cached, event.checks_in_flight) == (7, 2, 1)
    assert event.outcomes == {"passes": 4}
    assert event.phase == "drop"  # while reducing, the strategy names the event's phase
    assert event.signature == str(signature) and event.graph_code == "relu"


def test_outside_the_reduction_the_event_names_the_engines_phase() -> None:
    events: list[ProgressEvent] = []
    run = progress(events)
    run.stats = Stats(strategy="drop")
    run.enter("shrink")

    run.emit(force=True)

    assert events[-1].phase == "shrink"


def test_the_event_type_says_status_culprit_or_progress() -> None:
    events: list[ProgressEvent] = []
    run = progress(events)

    run.emit(force=True, status=JobState.succeeded, culprit_state=CulpritState.running)
    run.emit(force=True, culprit_state=CulpritState.done)
    run.emit(force=True)

    assert [event.type for event in events] == ["status", "culprit", "progress"]


def test_a_subscriber_that_raises_never_breaks_the_job() -> None:
    def broken(event: ProgressEvent) -> None:
        raise RuntimeError("subscriber down")

    run = Progress(RunFacts(spec=JobSpec(), program=ListProgram(), torch_version="2.13.0"),  # type: ignore[arg-type]
                   broken)

    run.say(Milestone.reproduced, "still going")


def test_a_timeline_point_is_the_smallest_programs_op_count_and_the_checks_so_far() -> None:
    run = progress(best=["relu", "cos", "sin"])
    run.record_point()
    run.stats = Stats(checks_total=9)
    run.facts.best = ["relu"]
    run.record_point()

    assert [(point.nodes, point.checks) for point in run.facts.timeline] == [(3, 0), (1, 9)]
    assert run.facts.timeline[0].elapsed_s <= run.facts.timeline[1].elapsed_s
