"""The original program's runs beside the reduction, and what candidates are judged against.

`OriginalRun` submits the original (compiled once, run `ORIGINAL_RUNS` times in one child) and
the program with no ops, answers the scheduler's predicate (`still_fails`: against the guess while
the original runs, else against its failure, waited for) and poll (`poll`: the hang guess, and
whether the original's verdict ends or restarts the reduction), runs the reduction and hands
back what the verdict says of it as a value (`reduce`: `Restart`, `Unreproduced` or None),
calibrates the candidates' timeout, confirms a guessed hang on the result, and verifies the result
in a fresh child where children are reused. Where the failure is known in advance
(`Verdict.known_in_advance`) and a candidate has shown it, the result need not wait for the verdict
(`defers_verdict`: deliver first, confirm after; `take_proof`, `wait_for_verdict`), and a verdict
that contradicts it keeps the reduction going (`contradiction`) instead of ending the job. What
the original's outcome means is `verdict.Verdict`'s (values, no waiting); this module does the
waiting and the acting: the facts it learns go into the run's `RunFacts`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from minify_contract.models import JobSpec, JobState, Milestone, OriginalState
from minify_worker import oracle
from minify_worker.engine.evaluator import SandboxEvaluator
from minify_worker.engine.hang import HangCalibration, HangWatch, Refuted
from minify_worker.engine.report import RunFacts
from minify_worker.engine.scheduler import Scheduler
from minify_worker.engine.scheduler import reduce as reduce_to_fixed_point
from minify_worker.engine.verdict import (
    Reproduced,
    Restart,
    Unreproduced,
    Verdict,
    empty_fails_reason,
    next_step,
    original_output,
)
from minify_worker.outcomes import Fails, Outcome, Stopped, TimedOut
from minify_worker.programs.candidates import StrategyContext, Tier
from minify_worker.sandbox import SandboxError, wait_unless_stopped

# The original is compiled once and run this many times in one child, to find its signature and
# tell a flaky runtime or accuracy failure from a steady one without paying for more compiles (a
# failure while compiling, a crash or a hang is one run).
ORIGINAL_RUNS = 3
# A candidate may take this many times the original's slowest run before it counts as a hang:
# candidates are smaller, but their compiles can miss caches the original's warmed.
TIMEOUT_FACTOR = 4.0
# At least this long, whatever the original took: a candidate's compile may miss every cache the
# original hit, and on a loaded machine (a CI box's parallel tests and their compiles) a few seconds'
# compile takes several times as long. A candidate cut short is judged not to fail, so a floor too
# low leaves ops in the result on a loaded machine (the floor was 10 s). Hangs are calibrated apart
# (`HangWatch`); a candidate that hangs where the original does not is rare.
MIN_CANDIDATE_TIMEOUT_S = 30.0
DEFAULT_TIMEOUT_FAILURE_S = 60.0
# A run of the original may take this long unless the spec says otherwise: minutes, not the job's
# hour, so a hanging compile shows as a hang in minutes.
DEFAULT_ORIGINAL_TIMEOUT_S = 600.0

Say = Callable[[Milestone, str], None]  # a step of the job, told as a progress event


class OriginalRun:
    """One job's original: its runs, its verdict, the candidates' timeout (see the module's doc).
    `remaining` gives the job's seconds left, `stop_reason` why it must stop (a cancel, the
    deadline), `reduce_phase` marks that the reduction proper begins (the target is known)."""

    def __init__(self, spec: JobSpec, facts: RunFacts, hang: HangCalibration, *, say: Say,
                 remaining: Callable[[], float], stop_reason: Callable[[], str | None],
                 reduce_phase: Callable[[], None]) -> None:
        self.spec = spec
        self.facts = facts
        self.program = facts.program
        self.verdict = Verdict(spec)
        self._say = say
        self._remaining = remaining
        self._stop_reason = stop_reason
        self._reduce_phase = reduce_phase
        self.evaluator: SandboxEvaluator | None = None
        self.scheduler: Scheduler | None = None
        self.graph: Any = None
        self._original_run: Future[Outcome] | None = None
        self._empty: Future[Outcome] | None = None
        # A verdict that ends or restarts the reduction: the scheduler's poll stops for it, and
        # `reduce` hands it back.
        self._ending: Restart | Unreproduced | None = None
        self._held_to_s: float | None = None  # a hang's result ran past the original's bound (`_hold_hang_to_bound`)
        # The original did not fail as a candidate already had, with the failure known in advance:
        # the result is kept, and says so (deliver first, confirm after).
        self.contradiction: Unreproduced | None = None
        self.delivered = False  # the result went out before the verdict: the verdict only confirms it
        self.hang_watch = HangWatch(hang, spec, hang_state=lambda: self.verdict.hang_state,
                                    shorten=self._shorten_timeout,
                                    say=say,
                                    count_ops=self.program.count_ops)

    def original_timeout(self) -> float:
        """How long one run of the original may take: the spec's bound, else minutes (a hang is
        judged by `DEFAULT_TIMEOUT_FAILURE_S` when the failure asked for is a timeout)."""
        return min(self._original_bound(), self._remaining())

    def _original_bound(self) -> float:
        limits = self.spec.limits
        if limits.original_timeout_s:
            return limits.original_timeout_s
        if self.spec.failure.kind == "timeout":
            return limits.candidate_timeout_s or DEFAULT_TIMEOUT_FAILURE_S
        return DEFAULT_ORIGINAL_TIMEOUT_S

    def first_timeout(self) -> float:
        """A candidate may take this long before the original has calibrated the timeout."""
        return self.spec.limits.candidate_timeout_s or self.original_timeout()

    def start(self, evaluator: SandboxEvaluator, scheduler: Scheduler, graph: Any) -> None:
        """Submit the original and the program with no ops; candidates may run from now on."""
        self.evaluator, self.scheduler, self.graph = evaluator, scheduler, graph
        evaluator.on_outcome = self.hang_watch.observe  # passing runs calibrate hangs
        submitted = time.monotonic()
        self._original_run = evaluator.submit(graph, timeout_s=self.original_timeout(), runs=ORIGINAL_RUNS,
                                              output=True)  # what it printed, should it not reproduce
        self.hang_watch.watch(evaluator, self._original_run, submitted, self.facts.nodes_original)
        # A hang guessed from candidates must not cut the original short: the guess is checked later.
        evaluator.spared.add(self._original_run)
        # The failure must depend on the program: the program with no ops runs beside it.
        self._empty = evaluator.submit(self.program.empty(graph), timeout_s=self.original_timeout())
        given = self.spec.failure.signature
        self._say(Milestone.original_started, "running the original" + (
            f"; candidates are judged against the given signature meanwhile: {given}" if given else ""))

    def reduce(self, passes: Sequence[Tier], *, on_accept: Callable[[Any, str], None]) -> Restart | Unreproduced | None:
        """Reduce the original with `passes` to a fixed point (`scheduler.reduce`), and return what
        the original's verdict says of it: the job ends (`Unreproduced`), the reduction starts over
        (`Restart`), or nothing (None: the result stands; the verdict is still out where it may
        follow the result, `defers_verdict`). Raises `Stopped` on a stop that is not the verdict's
        (a cancel, the deadline)."""
        assert self.scheduler is not None
        try:
            reduce_to_fixed_point(self.scheduler, self.graph, StrategyContext.for_failure(self.spec.failure.kind),
                                  passes, on_accept=on_accept)
            if not self.defers_verdict(self.facts.best):
                self.settle()  # a graph that offered no candidate at all never asked for it
                if self._ending is None and self.contradiction is None:
                    self._ending = self._hold_hang_to_bound()
        except Stopped:
            if self._ending is None:
                raise
        ending, self._ending = self._ending, None
        return ending

    def still_fails(self, outcome: Outcome) -> bool:
        """The scheduler's predicate: judged against the guess while the original runs (where the
        guess can judge it), else against the original's failure, waited for. Once the original's
        verdict ends or restarts the reduction, no candidate counts, and the scheduler's next poll
        stops it (`poll`)."""
        if not self.verdict.known and self._original_run is not None and not self._original_run.done():
            verdict = self.verdict.provisional(outcome)
            if verdict is not None:
                return verdict
        if self.settle() is not None:
            return False
        if self.contradiction is not None:  # judged by the failure a candidate showed, as before the verdict
            return bool(self.verdict.provisional(outcome))
        return self.verdict.judge(outcome)

    def defers_verdict(self, best: Any) -> bool:
        """Whether the result `best` may go out before the original's verdict: the failure is known
        in advance, a candidate showed it (`Verdict.proof`, so `best` is smaller than the original),
        and the original still runs."""
        assert self._original_run is not None
        return (not self.verdict.known and self._ending is None and self.contradiction is None
                and self.verdict.proof is not None and best is not self.graph and not self._original_run.done())

    def adopt_proof(self, best: Any) -> bool:
        """The target is the failure a candidate showed, while the original's verdict is out or
        contradicts it (`facts.signature`; the verdict, if it comes, confirms it). False when no
        candidate has shown a failure known in advance, or the result is the original itself."""
        proof = self.verdict.proof
        if self.verdict.known or proof is None or best is self.graph:
            return self.verdict.known
        self.facts.signature = proof
        if self.contradiction is None:
            self.facts.original_state = OriginalState.running
        return True

    def take_proof(self, best: Any) -> Unreproduced | None:
        """The reduction ended with the verdict out, or contradicting a candidate's proof: the result
        `best` goes out on the proof (`adopt_proof`). Returns what ends the job instead: the verdict
        contradicts the proof and no smaller program fails so (`contradiction`), or the program with
        no ops fails like the proof (the original's runs are stopped then). Raises `Stopped` on a stop."""
        if not self.adopt_proof(best):
            assert self.contradiction is not None
            return self.contradiction
        empty = self.empty_fails_like_proof()
        if empty is not None:
            self.stop()
            return Unreproduced(JobState.failed, empty)
        return None

    def empty_fails_like_proof(self) -> str | None:
        """Before a result delivered ahead of the verdict: the program with no ops must not fail as
        the candidates did (the failure must depend on the program). Returns why it does, if it does."""
        assert self._empty is not None and self.facts.signature is not None
        self._wait_for([self._empty])
        if oracle.still_fails(self._empty.result(), self.facts.signature, self.spec.failure):
            return empty_fails_reason(self.facts.signature, self.spec)
        return None

    def settle(self) -> Restart | Unreproduced | None:
        """Wait for the original's verdict (once), act on it, and return what ends or restarts the
        reduction, if anything does (`reduce` hands it back). Raises `Stopped` on a cancel."""
        if self.verdict.known or self._ending is not None or self.contradiction is not None:
            return self._ending
        assert self._original_run is not None
        if self.verdict.hang_guessed and not self._original_run.done():
            outcome = self._confirm_hang()
            if outcome is None:
                return self._ending
        else:
            self._wait_for([self._original_run])
            outcome = self._original_run.result()

        def empty() -> Outcome:
            self._wait_for([self._empty])
            return self._empty.result()

        settled = self.verdict.settle(outcome, empty)
        self.facts.original_compiles = 1  # its runs reused the one compiled program (run_wire_candidate's `runs`)
        self.facts.original_runs = settled.runs
        if isinstance(settled, Unreproduced) and settled.reproduced:  # the empty program fails so too
            self.facts.original_state = OriginalState.confirmed
            self._ending = settled
            return settled
        if isinstance(settled, Unreproduced):
            self.facts.original_state = OriginalState.not_reproduced
            self.facts.original_verdict = settled.reason
            self.facts.original_output = original_output(outcome)
            if self.verdict.proof is not None and (self.delivered or settled.status is JobState.not_reproducible):
                self.contradiction = settled  # a candidate proved the failure: the result stands
                if not self.delivered:
                    self._say(Milestone.original_not_reproduced, f"{settled.reason}; the reduction goes on "
                              f"with the failure a candidate showed: {self.verdict.proof}")
                return None
            if settled.status is JobState.not_reproducible:
                self.facts.next_step = next_step(outcome, self.spec, settled.empty_fails_too)
            self._ending = settled
            return settled
        adopted = self.facts.signature is not None  # the reduction ended on a candidate's proof
        self._reproduced(settled, outcome)
        if settled.restart is not None and not adopted:
            self._ending = Restart(settled.restart)
        return self._ending

    def _reproduced(self, settled: Reproduced, outcome: Outcome) -> None:
        """The original failed the wanted way: the target is known, the candidates' timeout is
        calibrated from its run, and candidates cut short by a guessed hang's timeout run again
        if the reduction restarts."""
        target = settled.signature
        self.facts.original_state = OriginalState.confirmed
        self.facts.original_failures = settled.failures
        self.facts.flaky = settled.flaky
        if not self.delivered:  # a verdict after the result confirms it and changes nothing delivered
            self.facts.signature = target
            if self.facts.flaky:
                self._say(Milestone.flaky, f"flaky: the original failed "
                           f"{self.facts.original_failures} of {self.facts.original_runs} runs")
            assert self.scheduler is not None
            self.scheduler.remember(self.graph, Fails(target))
        if target.kind == "timeout":
            if self.facts.candidate_timeout_s is None:  # else calibrated while the hang was a guess
                self.facts.candidate_timeout_s = self.first_timeout()
            self.hang_watch.calibrate()
        else:  # the culprit phase's probes get it too, where the verdict followed the result
            calibrated = max(MIN_CANDIDATE_TIMEOUT_S, TIMEOUT_FACTOR * _duration(outcome))
            bound = self.spec.limits.candidate_timeout_s
            self.facts.candidate_timeout_s = round(min(calibrated, bound) if bound else calibrated, 2)
            self.evaluator.set_timeout(self.facts.candidate_timeout_s)
        if self.delivered:
            return
        self._reduce_phase()
        self._say(Milestone.reproduced, f"reproduced: {target}")
        if settled.restart is not None:
            # Hangs decided by a guessed hang's short timeout may be slow candidates: run them again.
            cut_short = self.facts.candidate_timeout_s
            self.scheduler.forget(lambda earlier: isinstance(earlier, TimedOut) and earlier.after_s < cut_short)

    def _hold_hang_to_bound(self) -> Restart | None:
        """A hang the original showed, reduced with candidates judged by the calibrated timeout:
        the result must still hang at the bound the original was judged by (`HangWatch.hold_to_bound`;
        a guessed hang was confirmed so already, and a timeout the spec gives is the user's own).
        One that ends within it is a slow program, not a hang: the candidates' timeout is raised to a
        multiple of its run, what the shorter timeout decided is forgotten, and the reduction starts
        again from the original (`Restart`)."""
        best, timeout_s = self.facts.best, self.facts.candidate_timeout_s
        if self._bound_to_hold_to() is None or timeout_s is None:
            return None
        bound_s = self.original_timeout()
        if timeout_s >= bound_s:  # the time left is shorter than the candidates' timeout
            return None
        assert self.scheduler is not None
        self._say(Milestone.hang_confirming, f"holding the hang to the original's bound: the result "
                  f"({self.program.count_ops(best)} ops) runs with a {bound_s:g} s timeout")
        held = self.hang_watch.hold_to_bound(best, bound_s, wait_for=self._wait_for)
        if held is None:
            self._held_to_s = bound_s
            return None
        ran_s, raised_s = held
        self.facts.candidate_timeout_s = raised_s
        self.evaluator.set_timeout(raised_s)
        self.scheduler.forget(lambda earlier: isinstance(earlier, TimedOut) and earlier.after_s < raised_s)
        reason = (f"the result ran {ran_s:.1f} s and ended within the original's {bound_s:g} s: slow, not hung; "
                  f"reducing again from the original, candidates judged at {raised_s:g} s")
        self._say(Milestone.hang_refuted, reason)
        return Restart(reason)

    def _bound_to_hold_to(self) -> float | None:
        """The original's bound (whatever time is left) a hang's result is to be held to, where its
        candidates were judged by a shorter, calibrated timeout; None where nothing is to be held: not
        a hang, the result is the original itself, a guessed hang was confirmed on it, or the timeout
        is the spec's own."""
        target, best, timeout_s = self.facts.signature, self.facts.best, self.facts.candidate_timeout_s
        if (target is None or target.kind != "timeout" or best is None or best is self.graph or timeout_s is None
                or self.hang_watch.confirm_timeout_s is not None or self.spec.limits.candidate_timeout_s):
            return None
        bound_s = self._original_bound()
        return bound_s if timeout_s < bound_s else None

    def unheld_hang(self) -> str | None:
        """What a hang's result delivered before `_hold_hang_to_bound` could run (the job's time ran
        out first) was judged by, for the report: only the candidates' calibrated timeout, so it may be
        slow rather than hung (pytorch#148073's doubling compile: a result judged at 42 s with the
        sandbox's children sharing the cores ran 29 s alone). None where the result was held to the
        original's bound, a guessed hang was confirmed on it, the timeout is the spec's own, or the
        result is the original itself."""
        bound_s, timeout_s = self._bound_to_hold_to(), self.facts.candidate_timeout_s
        if bound_s is None or timeout_s is None or self._held_to_s is not None:
            return None
        return (f"the result was judged a hang by the candidates' calibrated timeout ({timeout_s:g} s) and not held "
                f"to the original's {bound_s:g} s bound before the time ran out: it may be slow rather than hung "
                f"(repro.py holds its run to {timeout_s:g} s)")

    def hang_bound_s(self) -> float | None:
        """For a hang's result, the longest it was seen still running: the original's bound it was held
        to, a guessed hang's confirmation, else the timeout candidates were judged by (repro.py holds
        its own run to it). None for any other failure."""
        if self.facts.signature is None or self.facts.signature.kind != "timeout":
            return None
        return self._held_to_s or self.hang_watch.confirm_timeout_s or self.facts.candidate_timeout_s

    def _shorten_timeout(self, timeout_s: float) -> None:
        """Candidates (those running too, never the original) get `timeout_s` if it is shorter."""
        if self.facts.candidate_timeout_s is None or timeout_s < self.facts.candidate_timeout_s:
            self.facts.candidate_timeout_s = timeout_s
            self.evaluator.set_timeout(timeout_s)

    def poll(self) -> str | None:
        """The scheduler asks this while it waits: is the original a hang by now, should the
        reduction stop (the original's verdict ends or restarts it, a cancel, the deadline)."""
        if self._ending is not None:
            return f"the original's verdict came: {self._ending.reason}"
        self.hang_watch.poll(self.verdict.known or self.verdict.guess is not None, self.verdict.adopt_hang)
        return self._stop_reason()

    def _confirm_hang(self) -> Outcome | None:
        """The reduction ended on a guessed hang while the original still runs: confirm it on the
        result (`HangWatch.confirm`). Refuted: forget what the short timeouts decided, and restart
        the reduction from the original, waiting for its outcome (None; `reduce` hands back why)."""
        assert self.facts.best is not None and self.verdict.guess is not None and self.scheduler is not None
        outcome = self.hang_watch.confirm(self.facts.best, self.verdict.guess, remaining_s=self._remaining(),
                                          wait_for=self._wait_for)
        if not isinstance(outcome, Refuted):
            return outcome
        self._say(Milestone.hang_refuted, outcome.reason)
        self.verdict.refute_hang()
        self.facts.candidate_timeout_s = None
        self.evaluator.set_timeout(self.first_timeout())
        self.scheduler.forget(lambda earlier: isinstance(earlier, TimedOut))
        self._ending = Restart(outcome.reason)
        return None

    def verify_in_a_fresh_child(self) -> str | None:
        """Where children are reused, run the result once more in a child that ran nothing else: it
        must fail the same way there. Returns why the result is in doubt, if it is."""
        pool, best = self.evaluator.live_pool(), self.facts.best
        if not pool.reuse or best is None or best is self.graph or self.facts.signature is None:
            return None
        timeout_s = self.facts.candidate_timeout_s or self.first_timeout()  # not calibrated while the verdict is out
        future = pool.submit(self.program.to_wire(best), timeout_s=timeout_s, fresh=True)
        if wait_unless_stopped(pool, [future], self._stop_reason):
            return None
        outcome = future.result()
        if oracle.still_fails(outcome, self.facts.signature, self.spec.failure):
            return None
        return (f"the result did not fail the same way when run again in a fresh child ({outcome.kind}): it may "
                "depend on what an earlier candidate left in a reused child")

    def wait_for_verdict(self) -> None:
        """Deliver first, confirm after: wait for the verdict on a result delivered before it (the
        facts say what it was). A stop (a cancel, the job's timeout) or a sandbox failure ends the
        wait, never the job: the facts say `stopped` or `lost`."""
        started = time.monotonic()
        self.delivered = True
        try:
            self.settle()
        except Stopped as stopped:
            self.cancel()
            self.facts.original_state = OriginalState.stopped
            self.facts.original_verdict = f"the wait for its verdict ended: {stopped.reason}"
        except SandboxError as error:
            self.facts.original_state = OriginalState.lost
            self.facts.original_verdict = f"the sandbox failed before its verdict: {error}"
        self.facts.phase_s["original"] = round(time.monotonic() - started, 3)

    def stop(self, *, cancel: bool = False) -> None:
        """No verdict will follow a result delivered without it (the job was cut short): its runs are
        cancelled and the facts say it stopped. `cancel`: the job was cancelled: cancel them anyway."""
        running = self.facts.original_state is OriginalState.running
        if running or cancel:
            self.cancel()
        if running:
            self.mark_stopped()

    def mark_stopped(self) -> None:
        """The job ended before the original's verdict."""
        self.facts.original_state = OriginalState.stopped
        self.facts.original_verdict = "the job ended before its verdict"

    def cancel(self) -> None:
        """Cancel the original's run and the empty program's, if they are still going."""
        for future in (self._original_run, self._empty):
            if future is not None and not future.done():
                self.evaluator.cancel(future)

    def _wait_for(self, futures: list[Future[Outcome]]) -> None:
        reason = wait_unless_stopped(self.evaluator, futures, self._stop_reason)
        if reason:
            raise Stopped(reason)


def _duration(outcome: Outcome) -> float:
    if isinstance(outcome, TimedOut):
        return outcome.after_s
    return getattr(outcome, "duration_s", 0.0)
