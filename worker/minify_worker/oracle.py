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

from minify_client.models import FailureSpec

from .outcomes import Crashed, Fails, Outcome, Signature, SignatureKind, TimedOut

_MAX_KEY = 240
_MAX_TEXT = 4000

# Wrappers whose own type says nothing: the signature is the type of what they wrap.
_WRAPPER_TYPES = ("InductorError", "BackendCompilerFailed", "LoweringException")

_NOISE_LINE = re.compile(
    r"^(Traceback \(most recent call last\)|While executing|Original traceback|Set TORCH_LOGS|"
    r"You can suppress this exception|Exception raised from|frame #|\s*File \")"
)
_COMPILER_ERROR = re.compile(r"(?:^|\s|:)(?:fatal )?error:\s*(?P<rest>.+)$")
_PATH = re.compile(r"(?:[A-Za-z]:)?(?:/[\w.\-+@~]+)+/?")
_HEX = re.compile(r"\b0x[0-9a-fA-F]+\b")
_LONG_HASH = re.compile(r"\b[0-9a-z]{20,}\b")
_GENERATED_NAME = re.compile(
    r"\b(tmp|buf|arg|primals|tangents|getitem|in_ptr|out_ptr|in_out_ptr|ks|xindex|x|y|r|s|u)\d+(_\d+)?\b"
)
_NODE_SUFFIX = re.compile(r"\b([A-Za-z][A-Za-z]*(?:_[A-Za-z]+)*)_\d+\b")
_NUMBER = re.compile(r"(?<![A-Za-z_])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_SPACES = re.compile(r"\s+")


def normalize_message(message: str) -> str:
    """The normalized first meaningful line of `message` (the compiler's first `error:` line if any)."""
    line = _first_compiler_error(message) or _first_meaningful_line(message)
    line = _PATH.sub("<path>", line)
    line = _HEX.sub("<hex>", line)
    line = _LONG_HASH.sub("<hash>", line)
    line = _GENERATED_NAME.sub(lambda match: f"{match.group(1)}N", line)
    line = _NODE_SUFFIX.sub(lambda match: f"{match.group(1)}_N", line)
    line = _NUMBER.sub("N", line)
    return _SPACES.sub(" ", line).strip()[:_MAX_KEY]


def _first_compiler_error(message: str) -> str | None:
    for line in message.splitlines():
        found = _COMPILER_ERROR.search(line)
        if found:
            return found.group("rest")
    return None


def _first_meaningful_line(message: str) -> str:
    for line in message.splitlines():
        stripped = line.strip()
        if stripped and not _NOISE_LINE.match(stripped):
            return stripped
    return ""


def unwrap_exception(error: BaseException) -> BaseException:
    """The exception that carries the meaning: inductor and dynamo wrap the real one."""
    seen = 0
    while type(error).__name__ in _WRAPPER_TYPES and seen < 8:
        inner = getattr(error, "inner_exception", None) or getattr(error, "inner_exc", None)
        inner = inner or error.__cause__
        if not isinstance(inner, BaseException):
            break
        error, seen = inner, seen + 1
    return error


def _split_wrapped_text(error: BaseException) -> tuple[str, str]:
    """(type name, message), reading "InnerType: message" out of a wrapper that only kept text."""
    name, message = type(error).__name__, str(error)
    if name in _WRAPPER_TYPES:
        found = re.match(r"^\s*(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Failure)):\s*(?P<rest>.*)", message,
                         re.DOTALL)
        if found:
            return found.group("type").rsplit(".", 1)[-1], found.group("rest")
    return name, message


def signature_from_exception(error: BaseException, kind: SignatureKind) -> Signature:
    """The signature of an exception raised while compiling (`compile_error`) or running it."""
    error = unwrap_exception(error)
    exc_type, message = _split_wrapped_text(error)
    return signature_from_text(exc_type, message, kind)


def signature_from_text(exc_type: str, message: str, kind: SignatureKind) -> Signature:
    return Signature(
        kind=kind,
        exc_type=exc_type,
        key=normalize_message(message),
        text=f"{exc_type}: {message}"[:_MAX_TEXT],
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


TIMEOUT_SIGNATURE = Signature(kind="timeout", exc_type="TimedOut", key="", text="TimedOut")


def outcome_signature(outcome: Outcome) -> Signature | None:
    """The failure signature an outcome carries, if it is a failure with one."""
    if isinstance(outcome, Fails | Crashed):
        return outcome.signature
    if isinstance(outcome, TimedOut):
        return TIMEOUT_SIGNATURE
    return None


def still_fails(outcome: Outcome, target: Signature, failure: FailureSpec) -> bool:
    """Whether `outcome` counts as the failure being minimized.

    - kind `timeout`: the candidate timed out.
    - kind `crash`: the child died of the same signal.
    - `failure.match` set: the failure's "ExceptionType: message" matches the regex, with the kind
      asked for (`any` accepts every kind).
    - otherwise: the same signature as `target` (kind, type and normalized key), with the kind
      asked for.
    `Passes`, `Invalid` and `OutOfMemory` never count: an unrelated reason to die is not the bug.
    """
    if failure.kind == "timeout":
        return isinstance(outcome, TimedOut)
    if not isinstance(outcome, Fails | Crashed):
        return False
    signature = outcome.signature
    if failure.kind != "any" and signature.kind != failure.kind:
        return False
    if failure.match is not None:
        return re.search(failure.match, signature.text or str(signature)) is not None
    return signature.same_as(target)
