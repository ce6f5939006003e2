"""The culprit phase: once the graph is minimal, which compiler stage is to blame, and which
settings a user can flip avoid the bug (docs/internals.md, "The culprit phase").

- Culprit: torch's compiler bisector (`bisector.py`) on the *minimal* graph; each of its probes
  runs in a sandbox child (`probe_in_child`), so a probe that crashes or hangs costs that probe.
  A probe counts as failing when it fails the way the job's target does (`oracle.still_fails`,
  as every candidate), and as working when it passes or fails with another exception; one that
  hung, crashed or ran out of memory otherwise runs once more with twice the time, and twice
  stops the bisection (a partial culprit, and why) rather than guess. `Culprit.notes` names each.
- Workarounds: each setting (`settings`) is first tried on the minimal program, in the slots
  the bisection (one probe at a time) leaves idle, sharing the probes the bisection runs anyway
  (its config changes, its aot_eager stage); a setting that made the minimal program pass is
  then tried on the *original*, and only one under which the original compiled and ran (within
  tolerance, for accuracy) is reported.
- The phase has a budget (`budget_s`): what did not finish in it is cancelled and said so.

By concept: `workarounds` (what the phase tries: `settings`), `phase` (the phase, in the engine's
process: `find`), `prober` (its probes, run in sandbox children), `probe` (a probe, in its child:
`probe_in_child`), `rewrite` (the phase as a job runs it, after the result: `after_result`); what
it found, as report.json and repro.py's header say it, is the neutral `minify_worker.programs.culprit`.
Every name callers use is re-exported here; no module bears the name of a function this package
exports.
"""

from minify_worker.programs.culprit import (
    PENDING_REASON,
    Found,
    header_lines,
    pending_fields,
    pending_header_lines,
    report_fields,
    stopped_fields,
    stopped_header_lines,
)
from minify_worker.programs.fx.culprit.phase import (
    BUDGET_ENV,
    BUDGET_FRACTION,
    MIN_BUDGET_ENV,
    MIN_BUDGET_S,
    budget_s,
    find,
    known_failing,
)
from minify_worker.programs.fx.culprit.probe import probe_in_child
from minify_worker.programs.fx.culprit.prober import CALL_TARGET
from minify_worker.programs.fx.culprit.rewrite import after_result
from minify_worker.programs.fx.culprit.workarounds import BACKEND, EXTRA_SETTINGS, no_stages, settings

__all__ = [
    "BACKEND",
    "BUDGET_ENV",
    "BUDGET_FRACTION",
    "CALL_TARGET",
    "EXTRA_SETTINGS",
    "MIN_BUDGET_ENV",
    "MIN_BUDGET_S",
    "PENDING_REASON",
    "Found",
    "after_result",
    "budget_s",
    "find",
    "header_lines",
    "known_failing",
    "no_stages",
    "pending_fields",
    "pending_header_lines",
    "probe_in_child",
    "report_fields",
    "settings",
    "stopped_fields",
    "stopped_header_lines",
]
