"""The original's verdict as a state machine (target.py), driven with made-up outcomes: no sandbox,
no compile. What the engine does with each value is tested end to end in test_engine*.py."""

from __future__ import annotations

import pytest

from minify_contract.models import JobSpec, JobState
from minify_worker.engine.verdict import Reproduced, Unreproduced, Verdict, next_step, original_output
from minify_worker.oracle import crash_signature
from minify_worker.outcomes import Crashed, Fails, Invalid, OutOfMemory, Passes, Signature, TimedOut

pytestmark = pytest.mark.fast

RELU = Signature(kind="compile_error", exc_type="RuntimeError", key="injected failure on relu",
                 text="RuntimeError: injected failure on relu")
COS = Signature(kind="compile_error", exc_type="RuntimeError", key="injected failure on cos",
                text="RuntimeError: injected failure on cos")
RUNTIME = Signature(kind="runtime_error", exc_type="ValueError", key="bad value", text="ValueError: bad value")


def target(**failure: object) -> Verdict:
    return Verdict(JobSpec.model_validate({"failure": failure}))


def test_the_first_failure_of_the_kind_asked_for_is_the_guess() -> None:
    guessing = target(kind="compile_error")

    assert guessing.provisional(Fails(RUNTIME)) is False  # not the kind asked for: never the guess
    assert guessing.guess is None
    assert guessing.provisional(Fails(RELU)) is True
    assert guessing.guess == RELU
    assert guessing.provisional(Fails(COS)) is False
    assert guessing.provisional(Passes()) is False


def test_a_hang_or_oom_waits_for_the_original_unless_a_hang_is_guessed() -> None:
    guessing = target()

    assert guessing.provisional(TimedOut(5.0)) is None
    assert guessing.provisional(OutOfMemory("killed")) is None
    assert guessing.adopt_hang(TimedOut(40.0)) is not None
    assert guessing.hang_state == "guessed"
    assert guessing.provisional(TimedOut(5.0)) is True


def test_a_given_signature_is_the_guess_from_the_first_check() -> None:
    given = target(signature=str(RELU))

    assert given.provisional(Fails(COS)) is False
    assert given.guess is None
    assert given.provisional(TimedOut(5.0)) is False  # not the given signature: judged at once
    assert given.provisional(Fails(RELU)) is True


def test_verdicts_the_original_agrees_with_stand() -> None:
    guessing = target()
    guessing.provisional(Fails(RELU))
    guessing.provisional(Passes())

    settled = guessing.settle(Fails(RELU, runs=3, failed_runs=3), empty=lambda: Passes())

    assert settled == Reproduced(RELU, runs=3, failures=3, restart=None)
    assert guessing.known and guessing.judge(Fails(RELU)) and not guessing.judge(Fails(COS))


def test_a_guess_the_original_contradicts_restarts_the_reduction() -> None:
    guessing = target()
    guessing.provisional(Fails(COS))

    settled = guessing.settle(Fails(RELU), empty=lambda: Passes())

    assert isinstance(settled, Reproduced) and settled.signature == RELU
    assert settled.restart is not None and "reducing again from the original" in settled.restart


def test_an_original_that_fails_in_some_runs_only_is_flaky() -> None:
    settled = target().settle(Fails(RUNTIME, runs=3, failed_runs=2), empty=lambda: Passes())

    assert isinstance(settled, Reproduced) and settled.flaky


def test_an_original_that_passes_is_not_reproducible() -> None:
    settled = target().settle(Passes(runs=3))

    assert isinstance(settled, Unreproduced)
    assert settled.status is JobState.not_reproducible and settled.runs == 3 and settled.seen is None


def test_an_original_that_fails_otherwise_names_what_it_saw() -> None:
    settled = target(kind="compile_error").settle(Fails(RUNTIME))

    assert isinstance(settled, Unreproduced) and settled.status is JobState.not_reproducible
    assert settled.seen == RUNTIME and "it failed differently" in settled.reason


def test_an_original_with_another_signature_than_the_given_one_is_not_reproducible() -> None:
    settled = target(signature=str(RELU)).settle(Fails(COS))

    assert isinstance(settled, Unreproduced) and settled.seen == COS
    assert str(RELU) in settled.reason


def test_an_original_that_cannot_run_fails_the_job() -> None:
    settled = target().settle(Invalid("no such op"))

    assert isinstance(settled, Unreproduced) and settled.status is JobState.failed
    assert "could not be run: no such op" in settled.reason


def test_a_failure_the_empty_program_shares_is_not_the_programs() -> None:
    asked: list[str] = []

    def empty() -> Fails:
        asked.append("empty")
        return Fails(RELU)

    settled = target().settle(Fails(RELU), empty=empty)

    assert isinstance(settled, Unreproduced) and settled.status is JobState.failed
    assert "does not depend on the program" in settled.reason and asked == ["empty"]
    assert settled.reproduced  # the original did fail so: report.json's original_state says confirmed


def test_the_empty_program_is_not_waited_for_when_the_original_did_not_fail() -> None:
    def empty() -> Passes:
        raise AssertionError("asked for the empty program's outcome")

    assert isinstance(target().settle(Passes(), empty=empty), Unreproduced)


def test_a_refuted_hang_forgets_the_guess_and_its_verdicts() -> None:
    guessing = target()
    guessing.adopt_hang(TimedOut(40.0))
    guessing.provisional(TimedOut(5.0))

    guessing.refute_hang()

    assert guessing.guess is None and guessing.hang_state is None
    settled = guessing.settle(Fails(RELU), empty=lambda: Passes())
    assert isinstance(settled, Reproduced) and settled.restart is None


# -- deliver first, confirm after (tests/worker/engine/test_deliver_first.py runs it) ---------------------------


@pytest.mark.parametrize(("failure", "known"), [
    ({"signature": "RuntimeError: injected failure on relu"}, True),
    ({"kind": "compile_error", "signature": "SIGSEGV"}, True),
    ({"kind": "accuracy"}, True),
    ({"kind": "compile_error"}, False),
    ({"kind": "any", "match": "relu"}, False),
    ({"signature": "TimedOut"}, False),
    ({"signature": "OutOfMemory"}, False),
    ({"kind": "timeout"}, False),
    ({"kind": "oom", "signature": "OutOfMemory"}, False),
])
def test_a_failure_is_known_in_advance_when_the_spec_names_it_and_it_needs_no_original_timing(
        failure: dict, known: bool) -> None:
    assert target(**failure).known_in_advance is known


def test_the_first_failure_of_a_failure_known_in_advance_is_its_proof() -> None:
    given = target(signature="RuntimeError: injected failure on relu")
    guessing = target(kind="compile_error")

    assert given.proof is None
    assert given.provisional(Fails(COS)) is False and given.proof is None
    assert given.provisional(Fails(RELU)) is True and given.proof == RELU
    assert guessing.provisional(Fails(RELU)) is True
    assert guessing.guess == RELU and guessing.proof is None  # a guess only: the original decides


def test_a_hang_is_never_an_accuracy_failure_known_in_advance() -> None:
    # Without a known failure a hang waits for the original's verdict (None); an accuracy job's
    # hang is never the failure, whatever the original does.
    assert target(kind="accuracy").provisional(TimedOut(5.0)) is False
    assert target(kind="accuracy").provisional(OutOfMemory("killed")) is False


# -- a not reproducible job: the original's own output and the next step (target.original_output, next_step)


def test_the_originals_output_is_what_it_printed_and_what_it_raised() -> None:
    chained = Signature(kind="compile_error", exc_type="RuntimeError", key="injected failure on relu",
                        text="RuntimeError: injected failure on relu",
                        chain=("BackendCompilerFailed: backend raised", "RuntimeError: injected failure on relu"))

    assert original_output(Passes(runs=3, output="UserWarning: TF32 is off\n")) == "UserWarning: TF32 is off"
    assert original_output(Passes(runs=3)) == ""
    assert original_output(Fails(RUNTIME, output="step 1\n")) == "step 1\n[raised] ValueError: bad value"
    assert original_output(Fails(chained)) == ("[raised, outermost first]\nBackendCompilerFailed: backend raised\n"
                                               "RuntimeError: injected failure on relu")
    assert original_output(TimedOut(12.0)) == "[ran past its timeout: stopped after 12.0 s]"


def test_the_next_step_fits_what_the_original_did() -> None:
    spec = JobSpec.model_validate({"backend": "inductor", "failure": {"kind": "compile_error"},
                                   "config": {"cpp.threads": 1}})

    passed = next_step(Passes(runs=3), spec)
    assert passed.startswith("the original passed 3 of 3 runs on inductor (cpu, cpp.threads=1)")
    assert "--inputs" in passed and "--dynamic" not in passed
    assert "--dynamic as_exported" in next_step(Passes(runs=3), spec.model_copy(update={"dynamic": "static"}))
    assert next_step(Fails(RUNTIME), spec).endswith("submit with --failure runtime_error")
    matched = spec.model_copy(update={"failure": spec.failure.model_copy(update={"kind": "any", "match": "relu"})})
    assert "a --match its message holds" in next_step(Fails(COS), matched)
    hung = next_step(TimedOut(30.0), spec)
    assert "--failure timeout" in hung and "--original-timeout" in hung
    assert "--memory-limit" in next_step(OutOfMemory("killed"), spec)


def test_a_failure_of_another_kind_the_empty_program_has_too_is_said_to_be_no_programs() -> None:
    """On an H200, torch 2.11+cu130 died loading every AOTInductor CUDA package: an accuracy job's
    original crashed, and so did the program with no ops. The job says the crash is not the
    program's, and does not send the user to submit it again as a crash (a job that would refuse it)."""
    segfault = Crashed(signal=11, signature=crash_signature(11))
    spec = JobSpec.model_validate({"backend": "aot_inductor", "device": "cuda", "failure": {"kind": "accuracy"}})

    settled = Verdict(spec).settle(segfault, empty=lambda: Crashed(signal=11, signature=crash_signature(11)))

    assert isinstance(settled, Unreproduced) and settled.status is JobState.not_reproducible
    assert settled.empty_fails_too and settled.seen == segfault.signature
    assert settled.reason.endswith("; the program with no ops fails that way too: that failure does not depend on "
                                   "the program (it is torch's, its backend's or the machine's)")
    step = next_step(segfault, spec, empty_fails_too=True)
    assert step.startswith("no program can be minimized to that failure (SIGSEGV)") and "--failure" not in step
    alone = Verdict(spec).settle(segfault, empty=lambda: Passes())
    assert isinstance(alone, Unreproduced) and not alone.empty_fails_too and "no ops" not in alone.reason
    assert "submit with --failure crash" in next_step(segfault, spec)
    other_signal = Verdict(spec).settle(segfault, empty=lambda: Crashed(signal=6, signature=crash_signature(6)))
    assert isinstance(other_signal, Unreproduced) and not other_signal.empty_fails_too
