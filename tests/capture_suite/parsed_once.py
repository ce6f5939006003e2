"""A pytest plugin for the sample suite's run only (suite.ini loads it): the statement a traceback
entry shows is found once for the run, not once for each failure that runs through it.

pytest finds the statement each traceback entry is in by parsing the entry's whole source file and
walking its tree, with a cache that lasts one failure's report. The suite's 17 failures run through
the same large torch modules (dynamo's and inductor's), so their reports did it 17 times over:
about 7 of the run's 24 CPU-s. The files do not change during the run; the reports read as before.
"""

from __future__ import annotations

import ast
from pathlib import Path

from _pytest._code.code import TracebackEntry
from _pytest._code.source import Source

_PARSED: dict[str | Path, ast.AST] = {}
_STATEMENTS: dict[tuple[str | Path, int, int], Source | None] = {}
_getsource = TracebackEntry.getsource


def _getsource_once(self: TracebackEntry, astcache: dict[str | Path, ast.AST] | None = None) -> Source | None:
    key = (self.frame.code.path, self.frame.code.firstlineno, self.lineno)
    if key not in _STATEMENTS:
        _STATEMENTS[key] = _getsource(self, _PARSED)
    return _STATEMENTS[key]


TracebackEntry.getsource = _getsource_once
