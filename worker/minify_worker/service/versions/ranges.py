"""Torch versions, ordered, and what a set of repro runs across them says: pure functions, no I/O.

A version is what `torch.__version__` prints: a release (`2.14.1`), a build of one (`2.15.0+cpu`,
`2.15.0+cu128`), a nightly (`2.16.0.dev20260101+cu128`) or a local build (`2.13.0a0+git1234abc`).
They order as PEP 440 orders them (a nightly and an `a0` build come before their release), the
local label last, only to keep two builds of one version apart.

One run's outcome (`classify`) is held against the job's signature: the same failure, another
one, a pass (repro.py printed `repro passed`), or a run that could not get as far as the compiler
(no torch, or an op or API the version lacks). The range (`regression_range`) and the fix
(`fixed_in`) read only the conclusive runs, the same failure and passes; the others are listed
in the summary line, never taken for a pass.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import total_ordering

from minify_contract import signatures
from minify_contract.models import RegressionRange, VersionOutcome, VersionRun

_VERSION = re.compile(
    r"^\s*v?(?P<release>\d+(?:\.\d+)*)"
    r"(?:[.-]?(?P<pre>a|b|rc|alpha|beta|c)(?P<pre_number>\d*))?"
    r"(?:[.-]?post(?P<post>\d*))?"
    r"(?:[.-]?dev(?P<dev>\d*))?"
    r"(?:\+(?P<local>[A-Za-z0-9.]+))?\s*$")
_PRE_RANK = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2}
# What repro.py prints (minify_worker/engine/artifacts.py's template): the last line of a failure on stderr,
# the one line of a pass on stdout.
FAILED_WITH = "repro failed with: "
PASSED = "repro passed"
# Root causes that say the repro never reached the compiler on that version: the script or torch
# could not be imported, or torch lacks an op, a module, a config key or an API the repro uses.
_CANNOT_RUN_TYPES = frozenset({"ImportError", "ModuleNotFoundError", "AttributeError", "SyntaxError"})


class VersionError(ValueError):
    """Text that is not a torch version."""


@total_ordering
@dataclass(frozen=True)
class TorchVersion:
    """A parsed `torch.__version__`, ordered as PEP 440 orders versions (local label last)."""

    text: str
    release: tuple[int, ...]
    pre: tuple[int, int] | None
    post: int | None
    dev: int | None
    local: str | None

    def _key(self) -> tuple:
        release = self.release + (0,) * (4 - len(self.release))
        # A dev release of a final version comes before its pre-releases; a pre-release before the final.
        pre = self.pre if self.pre is not None else ((-1, 0) if self.dev is not None and self.post is None
                                                     else (3, 0))
        post = -1 if self.post is None else self.post
        dev = float("inf") if self.dev is None else self.dev
        return release, pre, post, dev, self.local or ""

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, TorchVersion):
            return NotImplemented
        return self._key() < other._key()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TorchVersion) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        return self.text

    @property
    def public(self) -> str:
        """The version without its local label: `2.15.0` for `2.15.0+cpu`."""
        return self.text.split("+", 1)[0]

    @property
    def is_nightly(self) -> bool:
        return self.dev is not None


def parse_version(text: str) -> TorchVersion:
    """`text` as a TorchVersion; raises VersionError for anything that is not one."""
    found = _VERSION.match(text)
    if found is None:
        raise VersionError(f"{text!r} is not a torch version (e.g. 2.14.1, 2.15.0+cpu, 2.16.0.dev20260101)")
    pre = None
    if found.group("pre"):
        pre = (_PRE_RANK[found.group("pre")], int(found.group("pre_number") or 0))
    post = found.group("post")
    dev = found.group("dev")
    return TorchVersion(
        text=text.strip(), release=tuple(int(part) for part in found.group("release").split(".")), pre=pre,
        post=None if post is None else int(post or 0), dev=None if dev is None else int(dev or 0),
        local=found.group("local"))


def sort_versions(versions: Sequence[str]) -> list[str]:
    """`versions` oldest first, each once."""
    return [str(version) for version in sorted({parse_version(text) for text in versions})]


def same_signature(observed: str, expected: str) -> bool:
    """Whether two signatures (as report.json and repro.py write them) name the same failure: the
    same root-cause type and normalized key (minify_contract.signatures), a signal's name as written."""
    left, right = signatures.parse_signature(observed), signatures.parse_signature(expected)
    if left is None or right is None:
        return observed.strip() == expected.strip()
    return left[:2] == right[:2]


@dataclass(frozen=True)
class Classified:
    outcome: VersionOutcome
    signature: str | None = None
    reason: str | None = None


def classify(returncode: int | None, stdout: str, stderr: str, expected_signature: str | None,
             timeout_s: float | None = None, signal_name: str | None = None) -> Classified:
    """What one run of repro.py says, held against the job's signature.

    `returncode` None: the run was stopped after `timeout_s` (a hang is the bug when the job's
    signature is `TimedOut`). `signal_name`: the signal that killed it (a crash's signature).
    """
    expected = expected_signature or ""
    if returncode is None:
        observed = "TimedOut"
        if same_signature(observed, expected):
            return Classified(VersionOutcome.same, observed, f"still running after {timeout_s:g} s")
        return Classified(VersionOutcome.different, observed, f"still running after {timeout_s:g} s")
    if signal_name is not None:
        outcome = VersionOutcome.same if same_signature(signal_name, expected) else VersionOutcome.different
        return Classified(outcome, signal_name, f"killed by {signal_name}")
    if returncode == 0 and any(line.startswith(PASSED) for line in stdout.splitlines()):
        return Classified(VersionOutcome.passes, reason=_last_line_starting(stdout, PASSED))
    failed_with = _last_line_starting(stderr, FAILED_WITH)
    if failed_with is not None:
        observed = failed_with[len(FAILED_WITH):].strip()
        if same_signature(observed, expected):
            return Classified(VersionOutcome.same, observed)
        if _root_type(observed) in _CANNOT_RUN_TYPES:
            return Classified(VersionOutcome.cannot_run, observed, f"this torch lacks what the repro uses: {observed}")
        return Classified(VersionOutcome.different, observed)
    # Died before its excepthook was set (torch or the script's imports failed), or exited by itself.
    last = _last_meaningful_line(stderr)
    if returncode != 0 and last is not None and _root_type(last) in _CANNOT_RUN_TYPES:
        return Classified(VersionOutcome.cannot_run, None, f"this torch cannot import the repro: {last}")
    observed = f"exit status {returncode}"
    outcome = VersionOutcome.same if same_signature(observed, expected) else VersionOutcome.cannot_run
    reason = f"exited with status {returncode} without a verdict" + (f": {last}" if last else "")
    return Classified(outcome, observed if outcome is VersionOutcome.same else None, reason)


def _last_line_starting(text: str, prefix: str) -> str | None:
    found = [line for line in text.splitlines() if line.startswith(prefix)]
    return found[-1] if found else None


def _last_meaningful_line(text: str) -> str | None:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else None


def _root_type(signature: str) -> str | None:
    parsed = signatures.parse_signature(signature)
    return parsed[0] if parsed is not None else None


def _ordered(runs: Sequence[VersionRun]) -> list[VersionRun]:
    return sorted(runs, key=lambda run: parse_version(run.torch))


@dataclass(frozen=True)
class Range:
    """`regression_range`'s answer: the range, or None and why."""

    range: RegressionRange | None
    reason: str | None = None


def regression_range(runs: Sequence[VersionRun]) -> Range:
    """(last_good, first_bad]: `first_bad` the oldest version that fails the same way, `last_good`
    the newest older one that passes. None, with the reason, when none fails or none older passes."""
    ordered = _ordered(runs)
    failing = [run for run in ordered if run.outcome is VersionOutcome.same]
    if not failing:
        return Range(None, "no version fails the same way")
    first_bad = failing[0]
    older = [run for run in ordered if parse_version(run.torch) < parse_version(first_bad.torch)]
    passing = [run for run in older if run.outcome is VersionOutcome.passes]
    if passing:
        return Range(RegressionRange(last_good=passing[-1].torch, first_bad=first_bad.torch))
    if not older:
        return Range(None, f"the oldest version tried ({first_bad.torch}) fails too")
    return Range(None, f"no version older than {first_bad.torch} passes: "
                       + ", ".join(f"{run.torch} {_outcome_words(run)}" for run in older))


def fixed_in(runs: Sequence[VersionRun]) -> str | None:
    """The oldest version after the newest one that fails the same way that passes; None when the
    newest failing version has no newer passing one (or nothing fails the same way)."""
    ordered = _ordered(runs)
    failing = [run for run in ordered if run.outcome is VersionOutcome.same]
    if not failing:
        return None
    newest_bad = parse_version(failing[-1].torch)
    for run in ordered:
        if parse_version(run.torch) > newest_bad and run.outcome is VersionOutcome.passes:
            return run.torch
    return None


def _outcome_words(run: VersionRun) -> str:
    if run.outcome is VersionOutcome.different:
        return f"fails otherwise ({run.signature})"
    if run.outcome is VersionOutcome.cannot_run:
        return "cannot run the repro"
    return run.outcome.value


def summary(runs: Sequence[VersionRun]) -> str:
    """One line: `fails on 2.14.1, 2.15.0; passes on 2.13.0: regression in (2.13.0, 2.14.1]`, then
    the fix, the versions that fail otherwise and those that cannot run the repro."""
    ordered = _ordered(runs)
    if not ordered:
        return "no torch version tried"

    def named(outcome: VersionOutcome) -> list[str]:
        return [run.torch for run in ordered if run.outcome is outcome]

    parts = []
    if named(VersionOutcome.same):
        parts.append("fails on " + ", ".join(named(VersionOutcome.same)))
    if named(VersionOutcome.passes):
        parts.append("passes on " + ", ".join(named(VersionOutcome.passes)))
    different = [f"{run.torch} ({run.signature})" for run in ordered if run.outcome is VersionOutcome.different]
    if different:
        parts.append("fails otherwise on " + ", ".join(different))
    if named(VersionOutcome.cannot_run):
        parts.append("cannot run on " + ", ".join(named(VersionOutcome.cannot_run)))
    line = "; ".join(parts)
    if len(ordered) == 1:  # one torch on the workers: no range, no fix to tell
        return f"{line} (the only torch version tried)"
    found = regression_range(ordered)
    if found.range is not None:
        line += f": regression in ({found.range.last_good}, {found.range.first_bad}]"
    elif named(VersionOutcome.same):
        line += f": no regression range ({found.reason})"
    fix = fixed_in(ordered)
    if fix is not None:
        line += f"; fixed in {fix}"
    return line
