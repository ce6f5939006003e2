"""The original's verdict: what candidates are judged against, as a state machine of values.

The original is compiled and run while the reduction already goes on, so for a while candidates
are judged against a guess: the first candidate failure of the kind asked for (or the signature
the spec gives), or a hang guessed from how long the original has been running. `Verdict` holds
that guess and every verdict given against it; when the original's outcome comes, `settle` turns
it into a value: `Reproduced` (the signature from then on, and whether verdicts given against the
guess were wrong, so the reduction must start again from the original) or `Unreproduced` (the job
ends, with the status and reason to say). Nothing here waits, runs or raises: the engine feeds it
outcomes and acts on what it answers (engine.py), and it is tested with fake outcomes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from minify_contract import signatures
from minify_contract.models import FailureSpec, JobSpec, JobState
from minify_worker import oracle
from minify_worker.engine.hang import HangState
from minify_worker.outcomes import Outcome, Signature, TimedOut


@dataclass(frozen=True)
class Reproduced:
    """The original failed the wanted way: `signature` is the target from now on. `restart` says
    why candidates judged against the guess must be judged again (None: every verdict stands)."""

    signature: Signature
    runs: int
    failures: int
    restart: str | None = None

    @property
    def flaky(self) -> bool:
        return self.failures < self.runs


@dataclass(frozen=True)
class Unreproduced:
    """The original did not fail the wanted way, or its failure is not the program's: the job ends
    with `status` and `reason`; `seen` is a failure of the original the job did not take.
    `reproduced`: the original did fail the wanted way, but so does the program with no ops;
    `empty_fails_too`: the original failed another way than the one wanted, and so does the program
    with no ops (an AOTInductor CUDA package that crashes torch 2.11+cu130 as it loads, on an H200,
    whatever the program)."""

    status: JobState
    reason: str
    runs: int = 1
    seen: Signature | None = None
    reproduced: bool = False
    empty_fails_too: bool = False


@dataclass(frozen=True)
class Restart:
    """Candidates were judged against a guess that did not hold (the original failed otherwise, or
    a guessed hang was refuted): the reduction starts again from the original, for `reason`."""

    reason: str


Settled = Reproduced | Unreproduced


class Verdict:
    """One job's verdict on the original: the target signature, guessed while the original runs, then known
    (`signature`)."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self.failure: FailureSpec = spec.failure
        self.signature: Signature | None = None
        self.guess: Signature | None = None
        self._verdicts: set[tuple[Outcome, bool]] = set()  # given against the guess

    @property
    def known(self) -> bool:
        return self.signature is not None

    def may_be(self, signature: Signature) -> bool:
        """Whether `signature` may be the original's: any, unless the spec gives the signature
        (`failure.signature`), which then is the target from the first check: only a failure with
        it becomes the guess, so candidates are judged against it before any has failed."""
        given = self.failure.signature
        return given is None or oracle.matches_given(signature, given)

    @property
    def known_in_advance(self) -> bool:
        """Whether the spec says which failure is meant, so that a candidate failing so is itself
        proof of the bug, whatever the original does: a given signature, or an accuracy failure (a
        candidate's outputs against its own eager and fp64 references). Never a hang or running out
        of memory, which are judged by what the original did."""
        if self.failure.kind in ("timeout", "oom"):
            return False
        given = self.failure.signature
        if given is None:
            return self.failure.kind == "accuracy"
        parsed = signatures.parse_signature(given)
        return parsed is not None and parsed[0] not in (oracle.TIMEOUT_SIGNATURE.exc_type,
                                                        oracle.OOM_SIGNATURE.exc_type)

    @property
    def proof(self) -> Signature | None:
        """The failure a candidate showed that proves the bug before the original's verdict: the
        guess, when the failure is known in advance (`known_in_advance`)."""
        return self.guess if self.known_in_advance else None

    @property
    def hang_guessed(self) -> bool:
        """Whether candidates are judged against a hang guessed for the original."""
        return self.signature is None and self.guess is not None and self.guess.kind == "timeout"

    @property
    def hang_state(self) -> HangState | None:
        """Whether candidates are judged against a hang: guessed for the original, or known."""
        if self.hang_guessed:
            return "guessed"
        if self.signature is not None and self.signature.kind == "timeout":
            return "known"
        return None

    def provisional(self, outcome: Outcome) -> bool | None:
        """Judge `outcome` while the original still runs, against the first candidate failure that
        is the kind of failure asked for, the likeliest to be the original's. Each verdict is kept
        and checked by `settle`. None: the verdict needs the original's outcome (a hang or an
        out-of-memory, whose judgment depends on what the original did)."""
        signature = oracle.outcome_signature(outcome)
        if signature is None:
            return False  # a pass, or a candidate that could not run: never the failure
        if signature.kind in ("timeout", "oom") and not self.hang_guessed:
            # Not the signature the spec gives, nor the failure it names: never the failure,
            # whatever the original does.
            return None if self.may_be(signature) and not self.known_in_advance else False
        if self.guess is None:
            guess = target_of(outcome, self.failure)
            self.guess = guess if guess is not None and self.may_be(guess) else None
        verdict = self.guess is not None and oracle.still_fails(outcome, self.guess, self.failure)
        self._verdicts.add((outcome, verdict))
        return verdict

    def adopt_hang(self, outcome: TimedOut) -> Signature | None:
        """Judge candidates against the original hanging as `outcome` does, if that may be the
        target (`HangWatch.poll`'s guess); returns the guess, or None."""
        guess = target_of(outcome, self.failure)
        if guess is None or not self.may_be(guess):
            return None
        self.guess = guess
        return guess

    def refute_hang(self) -> None:
        """The guessed hang did not hold (`hang.Refuted`): forget it and every verdict given against it."""
        self.guess = None
        self._verdicts.clear()

    def settle(self, outcome: Outcome, empty: Callable[[], Outcome] | None = None) -> Settled:
        """The original's outcome (with `runs`: compiled once, run several times) decides the target.
        `empty` gives the outcome of the program with no ops (asked only when the original failed
        the wanted way), which must not fail the same way."""
        runs = getattr(outcome, "runs", 1)
        target = target_of(outcome, self.failure)
        if target is not None and not self.may_be(target):
            return Unreproduced(JobState.not_reproducible, (
                f"the original program fails with {target}, not with the signature the spec gives "
                f"({self.failure.signature}), on backend {self.spec.backend} ({self.spec.device})"), runs, target)
        if target is None and outcome.kind == "invalid":
            message = getattr(outcome, "message", "")
            return Unreproduced(JobState.failed, f"the program could not be run: {message}", runs)
        if target is None:
            seen = oracle.outcome_signature(outcome)
            reason = not_reproducible_reason(outcome, self.spec)
            shared = oracle.outcome_signature(empty()) if seen is not None and empty is not None else None
            if shared is not None and shared.same_as(seen):
                reason += ("; the program with no ops fails that way too: that failure does not depend on the "
                           "program (it is torch's, its backend's or the machine's)")
                return Unreproduced(JobState.not_reproducible, reason, runs, seen, empty_fails_too=True)
            return Unreproduced(JobState.not_reproducible, reason, runs, seen)
        if empty is not None and oracle.still_fails(empty(), target, self.failure):
            return Unreproduced(JobState.failed, empty_fails_reason(target, self.spec), runs, reproduced=True)
        self.signature = target
        wrong = any(oracle.still_fails(earlier, target, self.failure) != verdict for earlier, verdict in self._verdicts)
        self._verdicts.clear()
        restart = (f"the original fails with {target}, not as the first failing candidate did ({self.guess}): "
                   "reducing again from the original") if wrong else None
        return Reproduced(target, runs, getattr(outcome, "failed_runs", 1), restart)

    def judge(self, outcome: Outcome) -> bool:
        """Whether `outcome` fails the way the original does (the target must be known)."""
        assert self.signature is not None
        return oracle.still_fails(outcome, self.signature, self.failure)


def target_of(outcome: Outcome, failure: FailureSpec) -> Signature | None:
    """The signature of `outcome` if it fails the way `failure` asks for."""
    signature = oracle.outcome_signature(outcome)
    return signature if signature is not None and oracle.still_fails(outcome, signature, failure) else None


def empty_fails_reason(target: Signature, spec: JobSpec) -> str:
    """Why a job ends when the program with no ops fails the way it does."""
    return (f"the failure does not depend on the program: an empty graph (its inputs returned as they are) "
            f"fails the same way on {spec.backend} ({spec.device}): {target}")


def not_reproducible_reason(outcome: Outcome, spec: JobSpec) -> str:
    """Why the original's run (one that could run) is not the failure asked for."""
    seen = f"{outcome.kind} {getattr(outcome, 'runs', 1)}x"
    failure = oracle.outcome_signature(outcome)
    wanted = f" with {spec.failure.kind}" if spec.failure.kind != "any" else ""
    if spec.failure.match:
        wanted += f"{wanted and ','} matching {spec.failure.match!r}"
    if spec.failure.signature:
        wanted += f" with the signature the spec gives ({spec.failure.signature})"
    reason = f"the original program did not fail{wanted} on backend {spec.backend} ({spec.device}): {seen}"
    if failure is not None and spec.failure.kind != "any":
        reason += f"; it failed differently: {failure.text or failure}"
    elif failure is not None:
        reason += f"; its failure did not match: {failure.text or failure}"
    return reason


def original_output(outcome: Outcome) -> str:
    """What the original did in its child, for a job it did not reproduce: what it printed (the
    tail the sandbox kept) and, when it raised or died, the exception chain or the signal."""
    failure = oracle.outcome_signature(outcome)
    parts = [outcome.output.rstrip()] if outcome.output.strip() else []
    if isinstance(outcome, TimedOut):
        parts.append(f"[ran past its timeout: stopped after {outcome.after_s:.1f} s]")
    elif failure is not None:
        chain = failure.chain or (failure.text or str(failure),)
        parts.append("[raised, outermost first]\n" + "\n".join(chain) if len(chain) > 1 else f"[raised] {chain[0]}")
    return "\n".join(parts)


def next_step(outcome: Outcome, spec: JobSpec, empty_fails_too: bool = False) -> str:
    """What to try after the original did not fail the way `spec` asks (`outcome`, its runs), in
    the flags of `minify-client submit` (the dashboard's Submit form has the same fields).
    `empty_fails_too`: the program with no ops fails as the original did (`Unreproduced`)."""
    failure = oracle.outcome_signature(outcome)
    runs = getattr(outcome, "runs", 1)
    if failure is not None and empty_fails_too:
        return (f"no program can be minimized to that failure ({failure}): the program with no ops has it too, "
                f"so it comes from torch, the backend ({spec.backend}) or the machine ({spec.device}); the "
                "original's output shows where it happened (a crash: the Python stack it died in)")
    if isinstance(outcome, TimedOut):
        return (f"the original ran past its timeout ({outcome.after_s:.0f} s): if the hang is the bug, submit with "
                "--failure timeout; else give it longer with --original-timeout SECONDS")
    if failure is not None and failure.kind == "oom":
        return ("the original ran out of memory (the bound of one child): if that is the bug, submit with "
                "--failure oom; else raise --memory-limit MIB or lower --parallelism")
    if failure is not None:
        if spec.failure.signature:
            fix = f"submit with --signature '{failure}' (or none: the original's own failure is taken)"
        elif spec.failure.match:
            fix = f"submit with a --match its message holds (or none): {spec.failure.match!r} is not in it"
        else:
            fix = f"submit with --failure {failure.kind}"
        return f"it fails, only not the way this job asks: if that failure ({failure}) is the bug, {fix}"
    config = ", ".join(f"{key}={value!r}" for key, value in spec.config.items()) or "no config"
    step = (f"the original passed {runs} of {runs} runs on {spec.backend} ({spec.device}, {config}): submit it with "
            "the settings it failed with (--backend, --device, --config) and the inputs it failed on (--inputs; "
            "without them the example inputs the program carries are used)")
    if spec.dynamic == "static":
        step += ("; it ran with static shapes (--dynamic static): a failure of dynamic shapes needs "
                 "--dynamic as_exported")
    return step + "; a failure that comes only now and then may not show in 3 runs: submit it again"
