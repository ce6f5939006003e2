"""The oracle: failure signatures survive what changes between candidates; "still fails" is exact."""

from __future__ import annotations

import signal

import pytest

from minify_contract import signatures
from minify_contract.models import FailureSpec
from minify_worker import oracle
from minify_worker.outcomes import Crashed, Fails, Invalid, OutOfMemory, Passes, Signature, TimedOut

pytestmark = pytest.mark.fast

CPP_LOG = """C++ compile error

Command:
g++ /tmp/work/cache/j7/cj7tewcjheuggo7gsef4sbsrk.main.cpp -O3 -shared -fPIC

Output:
/tmp/work/cache/j7/cj7tewcjheuggo7gsef4sbsrk.main.cpp: In function 'void kernel(const float*, float*)':
/tmp/work/cache/j7/cj7tewcjheuggo7gsef4sbsrk.main.cpp:{line}:33: error: 'compile' was not declared in this scope
   {line} |                     auto tmp{n} = compile error!;
"""


class CppCompileError(Exception):
    pass


class InductorError(Exception):
    """Named like inductor's wrapper, which the oracle looks through."""


def test_paths_hex_and_numbers_are_normalized_away() -> None:
    first = oracle.normalize_message("bad value 12 at /tmp/a/b.cpp line 7, address 0x7ffd12ab")
    second = oracle.normalize_message("bad value 3 at /home/c/d.cpp line 90, address 0x1")
    assert first == second == "bad value N at <path> line N, address <hex>"


def test_generated_names_are_normalized_away() -> None:
    assert oracle.normalize_message("tmp12 undefined in buf3 (arg0_1, relu_2)") == \
        oracle.normalize_message("tmp4 undefined in buf10 (arg1_1, relu_7)")


def test_an_fx_node_is_the_same_with_or_without_its_number() -> None:
    """FX numbers a name only when it is taken: the joint graph's `add` of one program is `add_6`
    of the same program traced with symbolic sizes (pytorch#172956's partitioner error)."""
    assert oracle.normalize_message("Node add was invalid, but is output") == \
        oracle.normalize_message("Node add_6 was invalid, but is output") == "Node add was invalid, but is output"
    assert oracle.normalize_message("found in relu_default_12") == "found in relu_default"
    assert oracle.normalize_message("conv2d_1 and sum_1") == "conv2d_1 and sum"  # a name with digits keeps them


def test_the_first_meaningful_line_is_the_key() -> None:
    message = "\nTraceback (most recent call last):\nshape mismatch: [4] vs [5]\nmore detail"
    assert oracle.normalize_message(message) == "shape mismatch: [N] vs [N]"


def test_a_lead_in_line_is_keyed_with_the_line_it_leads_in_to() -> None:
    """Dynamo's error for a higher-order op opens the same way for every graph break: the break on
    the next line is the bug (pytorch#156724's nonzero in a cond branch, not a branch that returns
    None, which a script reduction reached when only the first line was the key)."""
    lead = "This higher order operator doesn't work unless it is captured completely. Got graph break/error:"
    nonzero = oracle.normalize_message(f"{lead}\n\nDynamic shape operator\n\n For more details ... gb0036")
    returns = oracle.normalize_message(f"{lead}\n\ntorch.cond: unsupported branch return type (constant non-int)")

    assert nonzero == oracle.normalize_message(lead) + " Dynamic shape operator"
    assert nonzero != returns
    assert oracle.normalize_message("at 3:4:") == "at N:N:"  # nothing after it: the line alone


def test_compiler_output_is_keyed_by_its_first_error_line() -> None:
    key = oracle.normalize_message(CPP_LOG.format(line=15, n=1))
    assert key == "'compile' was not declared in this scope"
    assert oracle.normalize_message(CPP_LOG.format(line=31, n=7)) == key


def test_an_inductor_wrapper_is_signed_by_the_exception_it_wraps() -> None:
    try:
        try:
            raise CppCompileError(CPP_LOG.format(line=15, n=1))
        except CppCompileError as inner:
            raise InductorError(f"CppCompileError: {inner}") from inner
    except InductorError as error:
        signature = oracle.signature_from_exception(error, "compile_error")
    assert (signature.exc_type, signature.key) == ("CppCompileError", "'compile' was not declared in this scope")
    assert signature.text.startswith("CppCompileError: C++ compile error")


def test_a_wrapper_that_kept_only_text_is_signed_by_the_type_named_in_it() -> None:
    signature = oracle.signature_from_exception(InductorError("LoweringException: no lowering for foo"),
                                                "compile_error")
    assert (signature.exc_type, signature.key) == ("LoweringException", "no lowering for foo")


def test_a_failed_import_is_signed_by_the_error_in_the_module_also_under_a_wrappers_words() -> None:
    # AOTInductor on CUDA (torch 2.11, an H200): the autotuning block that compiles the Triton
    # kernels raises RuntimeError(f"Failed to run autotuning code block: {e}") from the code
    # cache's RuntimeError("Failed to import <path>\\nSyntaxError: ..."), all inside InductorError.
    failed_import = RuntimeError("Failed to import /root/.cache/minify/inductor/tv/ctvf4k3lijgj6sjxc6jel4smhn7y.py\n"
                                 "SyntaxError: invalid syntax (ctvf4k3lijgj6sjxc6jel4smhn7y.py, line 20)")
    try:
        try:
            try:
                raise failed_import
            except RuntimeError as inner:
                raise RuntimeError(f"Failed to run autotuning code block: {inner}") from inner
        except RuntimeError as autotuning:
            raise InductorError(f"RuntimeError: {autotuning}") from autotuning
    except InductorError as wrapper:
        error = wrapper
    plain = RuntimeError(str(failed_import))

    signature = oracle.signature_from_exception(error, "compile_error")

    assert (signature.exc_type, signature.key) == ("SyntaxError", "invalid syntax (<hash>.py, line N)")
    assert signature.chain[1].startswith("RuntimeError: Failed to run autotuning code block: Failed to import /")
    assert oracle.signature_from_exception(plain, "compile_error").key == signature.key
    assert signatures.signature_line(error) == "SyntaxError: invalid syntax (<hash>.py, line N)"


def test_a_crash_is_signed_by_its_signal_name() -> None:
    signature = oracle.crash_signature(signal.SIGSEGV)
    assert (signature.kind, signature.exc_type) == ("crash", "SIGSEGV")


RELU = Signature("compile_error", "RuntimeError", "injected failure on relu", "RuntimeError: injected failure on relu")
COS = Signature("compile_error", "ValueError", "injected failure on cos", "ValueError: injected failure on cos")
RUNTIME_RELU = Signature("runtime_error", "RuntimeError", "injected failure on relu", RELU.text)


def test_the_same_signature_still_fails() -> None:
    assert oracle.still_fails(Fails(RELU), RELU, FailureSpec(kind="compile_error"))
    assert oracle.still_fails(Fails(RELU), RELU, FailureSpec(kind="any"))


def test_a_different_error_does_not_count() -> None:
    assert not oracle.still_fails(Fails(COS), RELU, FailureSpec(kind="any"))


def test_the_same_error_of_another_kind_does_not_count() -> None:
    assert not oracle.still_fails(Fails(RUNTIME_RELU), RELU, FailureSpec(kind="any"))
    assert not oracle.still_fails(Fails(RELU), RELU, FailureSpec(kind="runtime_error"))


def test_match_accepts_any_failure_of_the_kind_whose_text_matches() -> None:
    failure = FailureSpec(kind="compile_error", match=r"ValueError: injected")
    assert oracle.still_fails(Fails(COS), RELU, failure)
    assert not oracle.still_fails(Fails(RELU), RELU, failure)
    assert not oracle.still_fails(Fails(RUNTIME_RELU), RELU, FailureSpec(kind="compile_error", match="relu"))


def test_a_crash_counts_only_with_the_same_signal() -> None:
    segv = oracle.crash_signature(signal.SIGSEGV)
    failure = FailureSpec(kind="crash")
    assert oracle.still_fails(Crashed(signal.SIGSEGV, segv), segv, failure)
    assert not oracle.still_fails(Crashed(signal.SIGABRT, oracle.crash_signature(signal.SIGABRT)), segv, failure)


def test_timeouts_count_only_for_timeout_jobs() -> None:
    assert oracle.still_fails(TimedOut(5.0), oracle.TIMEOUT_SIGNATURE, FailureSpec(kind="timeout"))
    assert not oracle.still_fails(TimedOut(5.0), RELU, FailureSpec(kind="any"))
    assert not oracle.still_fails(Fails(RELU), oracle.TIMEOUT_SIGNATURE, FailureSpec(kind="timeout"))


def test_passing_invalid_and_out_of_memory_never_count() -> None:
    for outcome in (Passes(), Invalid("cannot build"), OutOfMemory("CUDA out of memory")):
        assert not oracle.still_fails(outcome, RELU, FailureSpec(kind="any", match=".*"))


def test_outcome_signature_gives_the_failure_a_job_would_target() -> None:
    assert oracle.outcome_signature(Fails(RELU)) == RELU
    assert oracle.outcome_signature(TimedOut(1.0)) == oracle.TIMEOUT_SIGNATURE
    assert oracle.outcome_signature(Passes()) is None
