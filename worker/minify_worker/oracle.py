"""What "still fails" means: failure signatures and the still-fails test (docs/internals.md).

A signature is the exception type plus the normalized first meaningful line of its message, or
the name of the signal a child died of. Normalization removes what changes from one candidate to
the next without changing the bug: file paths, hex and addresses, numbers, and generated names
(`tmp3`, `buf12`, `arg0_1`, `relu_2`). For compiler output (C++ or Triton errors, which quote a
whole build log) the key is the first `error:` line, so the same injected C++ error gives the
same signature whether the kernel around it came from relu→cos or relu alone.

Pure functions: no torch import, usable in the parent.
"""

from __future__ import annotations

import re
import signal as signal_module

from minify_contract import signatures
from minify_contract.models import FailureSpec

from .outcomes import Crashed, Fails, Outcome, OutOfMemory, Signature, SignatureKind, TimedOut

_MAX_TEXT = 4000


def normalize_message(message: str) -> str:
    """The normalized first meaningful line of `message` (see `signatures.normalize_message`)."""
    return signatures.normalize_message(message)


def unwrap_exception(error: BaseException) -> BaseException:
    """The innermost exception object of `error` that carries the meaning (wrappers unwrapped).

    A root cause known only from a wrapper's text has no object: `signature_from_exception`
    reads it from the text.
    """
    for _ in range(8):
        inner = getattr(error, "inner_exception", None) or getattr(error, "inner_exc", None)
        inner = inner or error.__cause__
        if type(error).__name__ not in signatures.WRAPPER_TYPES or not isinstance(inner, BaseException):
            break
        error = inner
    return error


def signature_from_exception(error: BaseException, kind: SignatureKind) -> Signature:
    """The signature of an exception raised while compiling (`compile_error`) or running it: its
    root cause's type and normalized message, with the whole chain of wrappers kept."""
    chain = signatures.exception_chain(error)
    exc_type, message = chain[-1]
    return signature_from_text(exc_type, message, kind, chain=tuple(signatures.describe_chain(chain)))


def signature_from_text(exc_type: str, message: str, kind: SignatureKind,
                        chain: tuple[str, ...] = ()) -> Signature:
    return Signature(
        kind=kind,
        exc_type=exc_type,
        key=normalize_message(message),
        text=f"{exc_type}: {message}"[:_MAX_TEXT],
        chain=chain if len(chain) > 1 else (),
    )


def signal_name(number: int) -> str:
    try:
        return signal_module.Signals(number).name
    except ValueError:
        return f"SIG{number}"


def crash_signature(number: int) -> Signature:
    """A child killed by signal `number`: the signature is the signal's name."""
    name = signal_name(number)
    description = signal_module.strsignal(number) if number > 0 else None
    return Signature(kind="crash", exc_type=name, key="", text=f"{name}: {description or 'killed'}")


def exit_signature(code: int) -> Signature:
    """A child that exited with `code` without reporting an outcome (a backend called exit)."""
    return Signature(kind="crash", exc_type="ExitStatus", key=str(code), text=f"ExitStatus: {code}")


def matches_given(signature: Signature, given: str) -> bool:
    """Whether an observed `signature` is the one a spec gives (`failure.signature`, text as
    report.json's `signature` writes it, `str(signature)`): the same exception type (or signal
    name) and the same key, the given message normalized by the same rules
    (`signatures.parse_signature`; an exit status compares as written). The kind is not part of
    the text: `failure.kind` says which kinds count."""
    parsed = signatures.parse_signature(given)
    if parsed is None:
        return False
    exc_type, key, message = parsed
    return exc_type == signature.exc_type and signature.key in (key, message)


TIMEOUT_SIGNATURE = Signature(kind="timeout", exc_type="TimedOut", key="", text="TimedOut")
OOM_SIGNATURE = Signature(kind="oom", exc_type="OutOfMemory", key="", text="OutOfMemory")


def outcome_signature(outcome: Outcome) -> Signature | None:
    """The failure signature an outcome carries, if it is a failure with one."""
    if isinstance(outcome, Fails | Crashed):
        return outcome.signature
    if isinstance(outcome, TimedOut):
        return TIMEOUT_SIGNATURE
    if isinstance(outcome, OutOfMemory):
        return OOM_SIGNATURE
    return None


def still_fails(outcome: Outcome, target: Signature, failure: FailureSpec) -> bool:
    """Whether `outcome` counts as the failure being minimized.

    - kind `timeout`: the candidate timed out; kind `oom`: it ran out of memory (its bound, or the
      machine's).
    - kind `crash`: the child died of the same signal.
    - `failure.match` set: the failure's "ExceptionType: message", or any link of its exception
      chain, matches the regex, with the kind asked for (`any` accepts every kind).
    - otherwise: the same signature as `target` (kind, type and normalized key), with the kind
      asked for.
    With `any`, a hang or running out of memory counts when the original did the same (its target
    is a timeout or an oom), whatever `match` says: the regex is for exceptions.
    `Passes` and `Invalid` never count, nor a failure of another kind than the one asked for: an
    unrelated reason to die is not the bug.
    """
    signature = outcome_signature(outcome)
    if signature is None:
        return False
    if failure.kind != "any" and signature.kind != failure.kind:
        return False
    if failure.kind in ("timeout", "oom"):
        return True
    if signature.kind in ("timeout", "oom"):
        return signature.same_as(target)
    if failure.match is not None:
        pattern = re.compile(failure.match)
        texts = (signature.text or str(signature), str(signature), *signature.chain)
        return any(pattern.search(text) for text in texts)
    return signature.same_as(target)
