"""What running one candidate can come to: typed values, never exceptions (docs/internals.md); and
`Stopped`, the one exception that ends work early (a cancel, the job's deadline)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from minify_contract import accuracy

SignatureKind = Literal["compile_error", "runtime_error", "accuracy", "crash", "timeout", "oom"]


def _output() -> str:
    """Every outcome's `output`: what its child printed (stdout and stderr, the last few KiB), kept
    only where the run asked for it (the original's: `SandboxPool.submit(output=True)`); never part
    of what makes two outcomes equal."""
    return field(default="", compare=False, repr=False)  # type: ignore[return-value]


@dataclass(frozen=True)
class Signature:
    """How a program fails: the kind, the exception type (or signal name) and a normalized key.

    Two failures are "the same" when kind, exc_type and key are equal; `text` is the raw
    "ExceptionType: message" (or signal description) kept for reports and `match` regexes, of the
    root cause; `chain` is one "Type: message" line per exception from the outermost wrapper to the
    root cause, when there were wrappers (`signatures.exception_chain`).
    """

    kind: SignatureKind
    exc_type: str
    key: str
    text: str = ""
    chain: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.exc_type}: {self.key}" if self.key else self.exc_type

    def same_as(self, other: Signature) -> bool:
        return (self.kind, self.exc_type, self.key) == (other.kind, other.exc_type, other.key)


# The key of an accuracy failure only integer or boolean outputs show (floating-point ones pass): it
# is not the same failure as one a floating-point output shows, so neither drifts into the other.
# The contract's, which the capture and repro.py key by too (`accuracy.detail_key`).
INTEGER_ONLY = accuracy.INTEGER_ONLY


@dataclass(frozen=True)
class Passes:
    """Every run passed. `runs` > 1 only for the original: compiled once, run that many times."""

    duration_s: float = 0.0
    runs: int = 1
    kind: Literal["passes"] = "passes"
    output: str = _output()


@dataclass(frozen=True)
class Fails:
    """`signature` is the first failure; of `runs` runs of one compiled program (the original
    runs several times, compiled once), `failed_runs` failed that way: fewer means flaky."""

    signature: Signature
    duration_s: float = 0.0
    runs: int = 1
    failed_runs: int = 1
    kind: Literal["fails"] = "fails"
    output: str = _output()


@dataclass(frozen=True)
class Crashed:
    signal: int
    signature: Signature
    duration_s: float = 0.0
    kind: Literal["crashed"] = "crashed"
    output: str = _output()


@dataclass(frozen=True)
class TimedOut:
    after_s: float
    kind: Literal["timed_out"] = "timed_out"
    output: str = _output()


@dataclass(frozen=True)
class OutOfMemory:
    message: str
    duration_s: float = 0.0
    kind: Literal["oom"] = "oom"
    output: str = _output()


@dataclass(frozen=True)
class Invalid:
    """The candidate could not be built or loaded: says nothing about the bug."""

    message: str
    duration_s: float = 0.0
    kind: Literal["invalid"] = "invalid"
    output: str = _output()


Outcome = Passes | Fails | Crashed | TimedOut | OutOfMemory | Invalid

_OUTCOME_TYPES: dict[str, type] = {
    "passes": Passes,
    "fails": Fails,
    "crashed": Crashed,
    "timed_out": TimedOut,
    "oom": OutOfMemory,
    "invalid": Invalid,
}


def outcome_to_dict(outcome: Outcome) -> dict[str, Any]:
    return asdict(outcome)


def outcome_from_dict(data: dict[str, Any]) -> Outcome:
    fields = dict(data)
    cls = _OUTCOME_TYPES[fields.pop("kind")]
    if "signature" in fields and isinstance(fields["signature"], dict):
        fields["signature"] = signature_from_dict(fields["signature"])
    return cls(**fields)


def signature_from_dict(data: dict[str, Any]) -> Signature:
    """A `Signature` from its `asdict` form (JSON turns its chain into a list)."""
    return Signature(**{**data, "chain": tuple(data.get("chain") or ())})


class Stopped(Exception):
    """The job was cancelled or ran out of time; the best program so far is still valid."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
