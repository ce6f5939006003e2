"""The real-bug corpus: one script per public PyTorch issue (`pt_<number>_<what>.py`), read from its header.

Each script's docstring opens with a one-line summary, then `key: value` lines:

    issue:    https://github.com/pytorch/pytorch/issues/NNN
    checks:   what the script asserts (or runs)
    fails on: the torch versions it was seen failing on (2.13.0+cpu checked here)
    kind:     wrong values (float) | wrong values (integer) | missing error (eager raises, compiled does not)
              | compile error | runtime error | crash | hang
    feature:  the compiler layer and the feature it exercises

Imports no torch: the runner reads the headers without running anything.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

CORPUS_DIR = Path(__file__).resolve().parent
KINDS = ("wrong values (float)", "wrong values (integer)", "missing error", "compile error", "runtime error", "crash",
         "hang")
_FIELD = re.compile(r"^(?P<key>issue|checks|fails on|kind|feature):\s*(?P<value>.*)$")


@dataclass(frozen=True)
class Case:
    """One script of the corpus, as its header describes it."""

    name: str  # the file's stem, e.g. pt_175966_arange_int64_mul
    path: Path
    summary: str
    issue: str
    checks: str
    fails_on: str
    kind: str
    feature: str

    @property
    def checks_values(self) -> bool:
        """The script compares the compiled result with eager's (wrong values, or a result where eager
        raises): the capture needs MINIFY_CAPTURE_ACCURACY, torch's minifier its accuracy level 4."""
        return self.kind.startswith("wrong values") or self.kind == "missing error"

    @property
    def number(self) -> int:
        return int(self.issue.rstrip("/").rsplit("/", 1)[-1])


def read_case(path: Path) -> Case:
    """Parse one script's header; a missing field or an unknown kind is an error naming the file."""
    docstring = ast.get_docstring(ast.parse(path.read_text()), clean=True)
    if not docstring:
        raise ValueError(f"{path.name}: no docstring header")
    lines = docstring.splitlines()
    fields: dict[str, str] = {}
    current = None
    for line in lines[1:]:
        match = _FIELD.match(line)
        if match:
            current = match["key"]
            fields[current] = match["value"].strip()
        elif current and line.startswith(" ") and line.strip():
            fields[current] += " " + line.strip()  # a field continued on an indented line
        else:
            current = None
    missing = [key for key in ("issue", "checks", "fails on", "kind", "feature") if key not in fields]
    if missing:
        raise ValueError(f"{path.name}: header lacks {', '.join(missing)}")
    if fields["kind"] not in KINDS:
        raise ValueError(f"{path.name}: kind {fields['kind']!r} is not one of {KINDS}")
    return Case(name=path.stem, path=path, summary=lines[0], issue=fields["issue"], checks=fields["checks"],
                fails_on=fields["fails on"], kind=fields["kind"], feature=fields["feature"])


def all_cases(directory: Path = CORPUS_DIR) -> list[Case]:
    """Every `pt_*.py` script of the corpus, in issue order."""
    return sorted((read_case(path) for path in directory.glob("pt_*.py")), key=lambda case: case.number)
