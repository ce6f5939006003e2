"""How a job's progress reads: plain lines for CI logs, a rich bar on a terminal, the final line."""

from __future__ import annotations

import io

import pytest

from minify_client.progress import PlainProgress, RichProgress, describe, progress_view
from minify_contract.models import JobState, ProgressEvent
from minify_contract.summaries import summary
from tests.support.scripted_server import job_status, minimizing_events

pytestmark = pytest.mark.fast


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def shrinking(nodes: int, checks: int, phase: str = "truncate", elapsed_s: float = 1.0) -> ProgressEvent:
    return ProgressEvent(phase=phase, nodes_original=40, nodes_current=nodes, checks_total=checks,
                         elapsed_s=elapsed_s)


def plain_lines(events: list[ProgressEvent], clock: FakeClock | None = None,
                interval_s: float = 10.0) -> list[str]:
    out = io.StringIO()
    view = PlainProgress(out, interval_s=interval_s, clock=clock or FakeClock())
    for event in events:
        view.update(event)
    view.close()
    return out.getvalue().splitlines()


def test_a_progress_event_reads_as_phase_nodes_and_checks():
    event = ProgressEvent(phase="delta", nodes_original=40, nodes_current=12, checks_total=37, checks_cached=15,
                          checks_in_flight=2)
    assert describe(event) == "delta: 40 → 12 nodes, 37 checks (15 cached), 2 running"


def test_status_and_log_events_read_as_themselves():
    assert describe(ProgressEvent(type="status", status=JobState.running)) == "status: running"
    assert describe(ProgressEvent(type="status", status=JobState.failed, message="bad program")) == (
        "status: failed (bad program)"
    )
    assert describe(ProgressEvent(type="log", message="kept relu")) == "kept relu"


def test_a_status_message_that_repeats_the_status_is_not_repeated():
    assert describe(ProgressEvent(type="status", status=JobState.queued, message="queued")) == "status: queued"
    assert describe(ProgressEvent(type="status", status=JobState.running, message="running on host-3")) == (
        "status: running on host-3"
    )


def test_plain_progress_prints_one_line_per_meaningful_change():
    assert plain_lines(minimizing_events(JobState.succeeded)) == [
        "[    0.0s] status: running",
        "[    0.5s] original: 2 → 2 nodes",
        "[    1.0s] truncate: 2 → 1 nodes, 4 checks (1 cached)",
        "[    1.0s] kept relu",
        "[    1.0s] status: succeeded",
    ]


def test_plain_progress_holds_back_check_counts_until_the_interval_passes():
    clock = FakeClock()
    out = io.StringIO()
    view = PlainProgress(out, interval_s=10.0, clock=clock)
    view.update(shrinking(30, 1))
    for checks in range(2, 6):
        clock.now += 1
        view.update(shrinking(30, checks))
    clock.now += 10
    view.update(shrinking(30, 9))
    assert out.getvalue().splitlines() == [
        "[    1.0s] truncate: 40 → 30 nodes, 1 checks",
        "[    1.0s] truncate: 40 → 30 nodes, 9 checks",
    ]


def test_plain_progress_prints_every_node_count_change_at_once():
    lines = plain_lines([shrinking(30, 1), shrinking(20, 2), shrinking(20, 3), shrinking(10, 4, phase="delta")])
    assert [line.split("] ")[1] for line in lines] == [
        "truncate: 40 → 30 nodes, 1 checks",
        "truncate: 40 → 20 nodes, 2 checks",
        "delta: 40 → 10 nodes, 4 checks",
    ]


def test_empty_log_events_print_nothing():
    assert plain_lines([ProgressEvent(type="log")]) == []


def test_progress_view_is_plain_when_the_stream_is_not_a_terminal():
    assert isinstance(progress_view(io.StringIO()), PlainProgress)


def test_rich_progress_renders_phase_and_counts():
    out = io.StringIO()
    view = RichProgress(out)
    view.start()
    for event in minimizing_events(JobState.succeeded):
        view.update(event)
    view.close()
    text = out.getvalue()
    assert "kept relu" in text
    assert "2 → 1 nodes" in text


def test_summary_of_a_minimized_job_gives_nodes_checks_and_time():
    status = job_status("j1", JobState.succeeded)
    assert summary(status) == "succeeded: 2 → 1 nodes, 5 checks (1 cached) in 1.5s"


def test_summary_of_an_unsuccessful_job_gives_the_reason():
    assert summary(job_status("j1", JobState.not_reproducible, reason="the original passes")) == (
        "not reproducible: the original passes"
    )
    assert summary(job_status("j1", JobState.cancelled)) == "cancelled"
