"""The hang watch: how a hang is told, and timed, when no timeout is given (docs/internals.md).

When the failure is a hang, passing runs calibrate the candidates' timeout: a candidate that runs
`HANG_TIMEOUT_FACTOR` times longer than the slowest passing run hangs (never less than
`HangCalibration.candidate_min_s`, by default `MIN_HANG_TIMEOUT_S`), so each hanging candidate costs
seconds instead of the original's bound.
With no timeout given, the original itself is not waited out: once it ran `HangCalibration`'s
multiple of what passing runs predict for its size it is guessed a hang, candidates are judged
against that guess, and the minimal result is confirmed at the end with a longer timeout.

`HangWatch` holds one job's calibration (passing runs, whether a hang may still be guessed, the
confirm timeout); the engine calls it where it decides: an outcome arrived (`observe`), the
scheduler polls (`poll`), the reduction ended on a guessed hang (`confirm`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from minify_contract.models import JobSpec, Milestone
from minify_worker import oracle
from minify_worker.outcomes import Outcome, Passes, Signature, TimedOut

# When the failure is a hang, candidates that pass calibrate the timeout: a candidate that runs
# this many times longer than the slowest passing one hangs; never less than the floor.
HANG_TIMEOUT_FACTOR = 3.0
MIN_HANG_TIMEOUT_S = 5.0
PASSES_TO_CALIBRATE = 2

HangState = Literal["guessed", "known"]


@dataclass(frozen=True)
class HangCalibration:
    """How a hang is told with no timeout given (no `--candidate-timeout`, `--original-timeout`),
    instead of waiting out the original's `DEFAULT_ORIGINAL_TIMEOUT_S` (engine.py).

    While the original runs, passing runs (the empty program, candidates) show how long a graph
    takes: the original counts as a hang for now once it ran `original_factor` times what they
    predict for its size (at least `original_min_s`); candidates then hang after
    `HANG_TIMEOUT_FACTOR` times the slowest passing run. The minimal result is confirmed at the end
    with `confirm_factor` times the slowest passing run (at least `confirm_min_s`): it must still be
    running then, else the reduction starts again from the original and waits for its outcome.
    `candidate_min_s` is the floor of the candidates' calibrated timeout, whatever told the hang.
    Tests scale the floors down.
    """

    original_factor: float = 10.0
    original_min_s: float = 30.0
    confirm_factor: float = 10.0
    confirm_min_s: float = 60.0
    candidate_min_s: float = MIN_HANG_TIMEOUT_S


@dataclass(frozen=True)
class Refuted:
    """The guessed hang did not hold: the minimal result finished within the confirm timeout."""

    reason: str


class Evaluator(Protocol):
    """What the watch needs of the engine's evaluator: run a graph, stop a run."""

    def submit(self, graph: Any, timeout_s: float | None = None, runs: int = 1,
               output: bool = False) -> Future[Outcome]: ...

    def cancel(self, future: Future[Outcome]) -> None: ...


class HangWatch:
    """One job's hang calibration. The engine says, through the callables it gives, whether the
    failure candidates are judged against is a hang (`hang_state`: guessed for the original, or
    known), how to shorten the candidates' timeout (`shorten`: running candidates too, never to a
    longer one), and how to tell the user (`say`)."""

    def __init__(self, calibration: HangCalibration, spec: JobSpec, *,
                 hang_state: Callable[[], HangState | None], shorten: Callable[[float], None],
                 say: Callable[[Milestone, str], None], count_ops: Callable[[Any], int]) -> None:
        self.calibration = calibration
        self.failure = spec.failure
        self._hang_state = hang_state
        self._shorten = shorten
        self._say = say
        self._count_ops = count_ops  # the representation's (programs.Representation.count_ops)
        # A hang may be guessed before the original's bound only when the user gave no timeout.
        self.may_guess = (spec.failure.kind in ("any", "timeout") and not spec.limits.candidate_timeout_s
                          and not spec.limits.original_timeout_s)
        self.passes: list[tuple[int, float]] = []  # (ops, seconds) of every passing run
        self.confirm_timeout_s: float | None = None  # the timeout that confirmed a guessed hang
        self._evaluator: Evaluator | None = None
        self._original_run: Future[Outcome] | None = None
        self._original_submitted = 0.0
        self._nodes_original = 1

    def watch(self, evaluator: Evaluator, original_run: Future[Outcome], submitted: float,
              nodes_original: int | None) -> None:
        """The original's run (submitted at `submitted`, `time.monotonic`) is the one to watch."""
        self._evaluator, self._original_run = evaluator, original_run
        self._original_submitted = submitted
        self._nodes_original = nodes_original or 1

    def observe(self, graph: Any, outcome: Outcome) -> None:
        """Every outcome as it comes (the sandbox's thread): passing runs calibrate hangs."""
        if not isinstance(outcome, Passes):
            return
        self.passes.append((self._count_ops(graph), outcome.duration_s))
        state = self._hang_state()
        if state == "guessed":
            self.calibrate(passes_needed=1)
        elif state == "known":
            self.calibrate()

    def calibrate(self, passes_needed: int = PASSES_TO_CALIBRATE) -> None:
        """When the failure is a hang (known, or guessed while the original runs), passing runs show
        how long a run that does not hang takes: later candidates (and those running) get a multiple
        of the slowest, with a floor, so each hanging candidate costs seconds instead of the
        original's whole bound. A guessed hang needs one passing run (the guess was made from it)."""
        durations = [seconds for _, seconds in self.passes]
        if len(durations) < passes_needed:
            return
        self._shorten(self._candidate_timeout(max(durations)))

    def _candidate_timeout(self, slowest_pass_s: float) -> float:
        """The candidates' timeout a passing run of `slowest_pass_s` calibrates: a multiple, floored."""
        return round(max(self.calibration.candidate_min_s, HANG_TIMEOUT_FACTOR * slowest_pass_s), 2)

    def poll(self, judged_otherwise: bool, adopt: Callable[[TimedOut], Signature | None]) -> None:
        """While the scheduler waits: guess that the original hangs once it ran `HangCalibration`'s
        multiple of what passing runs predict for its size. `adopt` makes such a hang the target
        candidates are judged against from then on (a candidate that runs past the calibrated
        timeout hangs too) and returns it, or None where it cannot be the target; the result is
        confirmed at the end (`confirm`) instead of waiting out the original's minutes. Not when
        candidates are `judged_otherwise` (the original's failure known, or another guess)."""
        if (not self.may_guess or judged_otherwise or self._original_run is None or self._original_run.done()
                or not self.passes):
            return
        running_s = time.monotonic() - self._original_submitted
        ops, seconds = max(self.passes)  # the largest passing graph predicts best, per op
        expected_s = seconds * self._nodes_original / max(1, ops)
        bound_s = max(self.calibration.original_min_s, self.calibration.original_factor * expected_s)
        if running_s < bound_s:
            return
        if adopt(TimedOut(round(running_s, 1))) is None:
            self.may_guess = False
            return
        self.calibrate(passes_needed=1)
        self._say(Milestone.hang_guessed, f"the original still runs after {running_s:.0f} s, more than "
                  f"{self.calibration.original_factor:g}x what passing runs predict for its size "
                  f"({expected_s:.1f} s): judged a hang for now, to be confirmed on the result")

    def hold_to_bound(self, result: Any, bound_s: float, *,
                      wait_for: Callable[[list[Future[Outcome]]], None]) -> tuple[float, float] | None:
        """The reduction ended on a known hang, its candidates judged by the calibrated timeout,
        shorter than `bound_s`, the one the original was judged by: run the smallest program,
        `result`, with `bound_s`. Still running then (or failing otherwise): None, it stands. Done
        before: it is slow, not hung (a compile whose time grows with the program, pytorch#148073,
        runs past any short bound once the program is big enough): its run calibrates the timeout
        again, and returns (how long it ran, the candidates' new timeout: `HANG_TIMEOUT_FACTOR`
        times that, at most `bound_s`)."""
        assert self._evaluator is not None
        run = self._evaluator.submit(result, timeout_s=bound_s)
        wait_for([run])
        outcome = run.result()
        if not isinstance(outcome, Passes):
            return None
        self.passes.append((self._count_ops(result), outcome.duration_s))
        return outcome.duration_s, min(bound_s, self._candidate_timeout(outcome.duration_s))

    def confirm(self, result: Any, guess: Signature, *, remaining_s: float,
                wait_for: Callable[[list[Future[Outcome]]], None]) -> Outcome | Refuted:
        """The reduction ended on the guessed hang `guess` while the original still runs: run the
        smallest program, `result`, with a longer timeout (`HangCalibration.confirm_*`) instead of
        waiting out the original's bound. Still running then: the hang is confirmed, the original
        is stopped and its outcome is a hang of the time it ran. Done before: the guess was wrong
        (`Refuted`; no hang is guessed again): the engine starts the reduction again from the
        original and waits for its outcome. The original's own outcome decides if it came meanwhile."""
        assert self._evaluator is not None and self._original_run is not None
        slowest_s = max((seconds for _, seconds in self.passes), default=0.0)
        confirm_s = round(min(max(self.calibration.confirm_min_s, self.calibration.confirm_factor * slowest_s),
                              remaining_s), 1)
        self._say(Milestone.hang_confirming, f"confirming the hang: the result ({self._count_ops(result)} ops) runs "
                                             f"with a {confirm_s:g} s timeout")
        confirm = self._evaluator.submit(result, timeout_s=confirm_s)
        wait_for([confirm])
        outcome = confirm.result()
        if self._original_run.done():
            return self._original_run.result()
        if oracle.still_fails(outcome, guess, self.failure):
            running_s = time.monotonic() - self._original_submitted
            self._evaluator.cancel(self._original_run)
            self.confirm_timeout_s = confirm_s
            self._say(Milestone.hang_confirmed, f"hang confirmed: the result still ran after {confirm_s:g} s; the "
                                                f"original was stopped after {running_s:.0f} s")
            return TimedOut(round(running_s, 1))
        self.may_guess = False
        return Refuted(f"the result did not hang with a {confirm_s:g} s timeout ({outcome.kind}): reducing again "
                       "from the original, waiting for its outcome")
