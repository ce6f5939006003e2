"""A spec that gives the failure's signature (`failure.signature`, `--signature`): how its text
compares with an observed signature (oracle.matches_given), and the engine judging candidates
against it from the first check, ending `not_reproducible` when the original fails otherwise and no
candidate showed the given signature."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from examples import programs
from minify_contract.models import FailureSpec, JobSpec, JobState, Milestone, ProgressEvent
from minify_contract.specflags import add_spec_arguments, spec_from_args
from minify_worker import oracle
from minify_worker.engine import MinifyResult, minify
from minify_worker.outcomes import Signature
from tests.support.backends import PREFIX
from tests.support.graphs import ops_of, save_chain, save_cos_sin_relu

RELU = "RuntimeError: injected failure on relu"

CPP_LOG = ("C++ compile error\n\nCommand:\ng++ /tmp/torchinductor_x/ab/cab12.cpp -o /tmp/x.so\n\nOutput:\n"
           "/tmp/torchinductor_x/ab/cab12.cpp:14:27: error: 'tmp3' was not declared in this scope\n")


@pytest.mark.parametrize("observed", [
    oracle.signature_from_text("RuntimeError", "injected failure on relu", "compile_error"),
    oracle.signature_from_text("CppCompileError", CPP_LOG, "compile_error"),
    oracle.signature_from_text("AssertionError", "expected size 20 but got 10 at dim 0", "runtime_error"),
    Signature(kind="accuracy", exc_type="AccuracyError", key=""),
    oracle.crash_signature(11),
    oracle.exit_signature(3),
    oracle.TIMEOUT_SIGNATURE,
])
def test_the_text_report_json_writes_matches_the_signature_it_came_from(observed: Signature) -> None:
    assert oracle.matches_given(observed, str(observed))


def test_a_given_message_is_normalized_by_the_same_rules() -> None:
    observed = oracle.signature_from_text("CppCompileError", CPP_LOG, "compile_error")

    assert str(observed) == "CppCompileError: 'tmpN' was not declared in this scope"
    assert oracle.matches_given(observed, f"CppCompileError: {CPP_LOG}")  # the raw text, as an error prints
    assert oracle.matches_given(observed, "torch._inductor.exc.CppCompileError: 'tmp7' was not declared in this scope")
    assert oracle.matches_given(observed, f"InductorError: CppCompileError: {CPP_LOG}")  # a wrapper's text


@pytest.mark.parametrize("given", [
    "RuntimeError: injected failure on cos",   # another message
    "ValueError: injected failure on relu",    # another type
    "RuntimeError",                            # the type alone: the key is part of the signature
])
def test_another_type_or_message_does_not_match(given: str) -> None:
    assert not oracle.matches_given(oracle.signature_from_text("RuntimeError", "injected failure on relu",
                                                               "compile_error"), given)


def test_an_exit_status_compares_as_written() -> None:
    assert oracle.matches_given(oracle.exit_signature(3), "ExitStatus: 3")
    assert not oracle.matches_given(oracle.exit_signature(4), "ExitStatus: 3")


def test_a_signature_that_names_no_type_is_refused_by_the_spec() -> None:
    with pytest.raises(ValidationError, match="must start with an exception type or a signal name"):
        FailureSpec(signature="failed with injected failure on relu")
    assert FailureSpec(signature="SIGSEGV").signature == "SIGSEGV"


def test_the_signature_flag_sets_failure_signature() -> None:
    parser = argparse.ArgumentParser()
    add_spec_arguments(parser)

    assert spec_from_args(parser.parse_args(["--signature", RELU])).failure.signature == RELU
    assert spec_from_args(parser.parse_args([])).failure.signature is None


# -- the engine ----------------------------------------------------------------------------------


def run(program: Path, out: Path, backend: str, signature: str | None) -> tuple[MinifyResult, list[ProgressEvent]]:
    spec = JobSpec.model_validate({"backend": f"{PREFIX}:{backend}", "failure": {"signature": signature},
                                   "limits": {"parallelism": 2}, "shrink": False, "culprit": False})
    events: list[ProgressEvent] = []
    return minify(program, spec, out, on_event=events.append), events


def restarted(events: list[ProgressEvent]) -> bool:
    return any(event.milestone is Milestone.restarted for event in events)


@pytest.mark.waits
def test_a_given_signature_is_the_target_from_the_first_check(tmp_path: Path, test_backends_allowed: None) -> None:
    # The original takes 5 s to fail on relu; a candidate with cos and no relu fails at once with a
    # ValueError. Without a signature that first failure is the guess, and the original's outcome
    # restarts the reduction; with the original's signature given, no candidate is judged wrongly.
    program = save_cos_sin_relu(tmp_path)

    guessed, guessed_events = run(program, tmp_path / "guessed", "fail_on_relu_slowly_or_at_once_on_cos", None)
    given, given_events = run(program, tmp_path / "given", "fail_on_relu_slowly_or_at_once_on_cos", RELU)

    assert guessed.status is given.status is JobState.succeeded, (guessed.reason, given.reason)
    assert given.report.signature == guessed.report.signature == RELU
    assert ops_of(given.report.graph_code) == ops_of(guessed.report.graph_code) == ["relu"]
    assert given.report.graph_code == guessed.report.graph_code
    assert restarted(guessed_events) and not restarted(given_events)
    assert given.report.checks_total <= guessed.report.checks_total


def test_an_original_that_fails_otherwise_is_not_reproducible_naming_both(
        tmp_path: Path, test_backends_allowed: None) -> None:
    # No candidate fails with the given ValueError, and the original fails on relu: the job does not
    # succeed on the given signature. (A candidate that shows the given signature is kept even when
    # the original fails otherwise: tests/worker/engine/test_deliver_first.py.)
    program = save_chain(tmp_path, ("sin", "cos", "relu", "exp"))

    result, _ = run(program, tmp_path / "out", "fail_on_relu", "ValueError: injected failure on cos")

    assert result.status is JobState.not_reproducible
    assert "fails with RuntimeError: injected failure on relu" in (result.reason or "")
    assert "not with the signature the spec gives (ValueError: injected failure on cos)" in (result.reason or "")


@pytest.mark.inductor
def test_the_offline_command_takes_inductors_signature_as_report_json_wrote_it(tmp_path: Path) -> None:
    # What report.json and repro.py say for inductor's C++ relu bug, with the message as the
    # compiler printed it: the given text is normalized by the same rules.
    program = tmp_path / "relu_cos.pt2"
    torch.export.save(programs.relu_cos()[0], program)
    given = ("torch._inductor.exc.CppCompileError: /tmp/x/c3.cpp:12:20: error: \u2018compile\u2019 was not "
             "declared in this scope")

    done = subprocess.run([sys.executable, "-m", "minify_worker.cli", "minify", str(program),
                           "--config", "cpp.inject_relu_bug_TESTING_ONLY=compile_error", "--signature", given,
                           "--no-shrink", "--no-culprit", "--out", str(tmp_path / "out"), "--json"],
                          capture_output=True, text=True, timeout=600)

    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["signature"] == "CppCompileError: \u2018compile\u2019 was not declared in this scope"
    assert ops_of(report["graph_code"]) == ["relu"]
