"""A run's progress as people and programs see it: the phase clock, the timeline, the events.

`Progress` keeps report.json's `phase_s` (seconds per phase) and `timeline` (ops and checks over
time) in the run's `RunFacts`, and turns each step into a `ProgressEvent` for the run's subscriber:
steps (`say`, with their `Milestone`) always, periodic progress at most every `EVENT_INTERVAL_S`.
A subscriber that raises never breaks the job.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from minify_contract.models import CulpritState, JobState, Milestone, ProgressEvent, TimelinePoint
from minify_worker.engine.report import RunFacts
from minify_worker.engine.scheduler import Stats

log = logging.getLogger(__name__)

EVENT_INTERVAL_S = 0.2


class Progress:
    def __init__(self, facts: RunFacts, on_event: Callable[[ProgressEvent], None] | None) -> None:
        self.facts = facts
        self.on_event = on_event
        self.started = time.monotonic()
        self.phase = "prepare"
        self.stats: Stats | None = None  # the scheduler's, once there is one
        self._phase_started = self.started
        self._last_event = 0.0
        self._lock = threading.Lock()

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def enter(self, phase: str) -> None:
        """Close the current phase's clock (`Report.phase_s`) and start `phase`'s."""
        now = time.monotonic()
        self.facts.phase_s[self.phase] = round(self.facts.phase_s.get(self.phase, 0.0) + now - self._phase_started, 3)
        self.phase, self._phase_started = phase, now

    def record_point(self) -> None:
        """A point of the timeline: the smallest program's op count and the checks so far."""
        assert self.facts.best is not None
        self.facts.timeline.append(TimelinePoint(elapsed_s=round(self.elapsed_s(), 3),
                                                 nodes=self.facts.program.count_ops(self.facts.best),
                                                 checks=self.stats.checks_total if self.stats else 0))

    def reduction_begins(self) -> None:
        """The original's verdict came while candidates were judged against the guess: the
        reduction proper begins (unless the verdict came in a later phase, the shrink)."""
        if self.phase == "reproduce":
            self.enter("reduce")

    def accepted(self, graph: Any, description: str) -> None:
        """A smaller program was accepted: it is the smallest so far, a point and an event."""
        self._new_best(graph, Milestone.accepted, description)

    def restarted(self, graph: Any, reason: str) -> None:
        """The reduction starts over from the original `graph`, for `reason`."""
        self._new_best(graph, Milestone.restarted, reason)

    def _new_best(self, graph: Any, milestone: Milestone, message: str) -> None:
        self.facts.best = graph
        self.record_point()
        self.emit(force=True, graph=graph, milestone=milestone, message=message)

    def say(self, milestone: Milestone, message: str) -> None:
        """A step of the job, typed and told."""
        self.emit(force=True, milestone=milestone, message=message)

    def emit(self, force: bool = False, *, graph: Any | None = None, status: JobState | None = None,
             message: str | None = None, culprit_state: CulpritState | None = None,
             milestone: Milestone | None = None) -> None:
        """An event for the subscriber; a periodic one (not `force`) only every `EVENT_INTERVAL_S`.
        `graph`: a smaller program just accepted (its code goes with the event)."""
        if self.on_event is None:
            return
        now = time.monotonic()
        with self._lock:
            if not force and now - self._last_event < EVENT_INTERVAL_S:
                return
            self._last_event = now
        stats, facts = self.stats, self.facts
        event = ProgressEvent(
            type="culprit" if culprit_state is not None and status is None else
            "status" if status is not None else "progress",
            phase=stats.strategy if stats and self.phase == "reduce" else self.phase,
            nodes_original=facts.nodes_original,
            nodes_current=facts.program.count_ops(facts.best) if facts.best is not None else None,
            checks_total=stats.checks_total if stats else 0,
            checks_cached=stats.checks_cached if stats else 0,
            checks_in_flight=stats.checks_in_flight if stats else 0,
            outcomes=dict(stats.outcomes) if stats else {},
            elapsed_s=round(now - self.started, 3),
            signature=str(facts.signature) if facts.signature else None,
            graph_code=facts.program.code(graph) if graph is not None else None,
            status=status,
            message=message,
            milestone=milestone,
            culprit_state=culprit_state,
        )
        try:
            self.on_event(event)
        except Exception:  # a broken subscriber must not break the job
            log.exception("progress callback failed")
