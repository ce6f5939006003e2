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
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch.fx as fx

from minify_client.config_keys import config_setting
from minify_client.models import Culprit, CulpritState, JobSpec, Workaround
from minify_client.progress import culprit_text
from minify_worker import bisector, oracle
from minify_worker.graph import graph_to_wire
from minify_worker.outcomes import (
    Crashed,
    Fails,
    Invalid,
    Outcome,
    OutOfMemory,
    Passes,
    Signature,
    TimedOut,
    outcome_from_dict,
    outcome_to_dict,
)
from minify_worker.sandbox import SandboxCallError, SandboxError, SandboxPool

log = logging.getLogger(__name__)

CALL_TARGET = "minify_worker.culprit:probe_in_child"
# The phase may take this share of the job's time to the result, and never less than the floor.
# It runs after the result is delivered, so the budget bounds the worker's time, not the user's
# wait: the floor lets a whole bisection (about 17 probes of the minimal graph, 11 s on the quiet
# 2-core box, 15-20 s with it loaded 8x, where a 20 s floor cut one in two) finish.
BUDGET_FRACTION = 0.2
MIN_BUDGET_S = 60.0
MIN_BUDGET_ENV = "MINIFY_CULPRIT_MIN_BUDGET_S"
BACKEND = "backend"  # a workaround that changes the backend, not a config key

# Settings tried beside the bisector's config changes (bisector.config_changes), and why:
# - pattern_matcher off: inductor's pattern rewrites (fusions, replacements) are where wrong
#   rewrites live, and turning them off keeps the rest of inductor;
# - freezing on: parameters folded as constants, another path through inductor's passes;
# - cpp_wrapper on: C++ instead of Python wrapper code (aot_inductor always uses it);
# - the aot_eager backend (inductor jobs only): the same graph through aot_autograd without
#   inductor, slower but a way around any inductor bug.
# Not max_autotune: it benchmarks kernel choices while compiling, multiplying each probe's cost,
# and it adds code paths more often than it avoids one.
EXTRA_SETTINGS: tuple[tuple[str, Any], ...] = (("pattern_matcher", False), ("freezing", True),
                                              ("cpp_wrapper", True))


@dataclass
class Found:
    """What the phase found, as report.json says it (`report_fields`)."""

    culprit: Culprit | None = None
    reason: str | None = None
    workarounds: list[Workaround] = field(default_factory=list)
    tried: dict[str, str] = field(default_factory=dict)


def settings(spec: JobSpec) -> list[tuple[str, Any]]:
    """The settings worth trying for the spec's backend, each different from what the job uses:
    inductor's config for backends that use inductor (custom ones may), functorch's cse for those
    that trace with aot_autograd, the aot_eager backend for inductor jobs."""
    if spec.backend == "eager":
        return []
    changes = [(key, value) for _, key, value in bisector.config_changes()]
    if spec.backend != "aot_eager":
        changes += [(key, value) for key, value in EXTRA_SETTINGS
                    if not (key == "cpp_wrapper" and spec.backend == "aot_inductor")]
    else:
        changes = [(key, value) for key, value in changes if key.startswith("torch._functorch.")]
    wanted = [(key, value) for key, value in changes if _current_value(key, spec) != value]
    if spec.backend == "inductor":
        wanted.append((BACKEND, "aot_eager"))
    return wanted


def _current_value(key: str, spec: JobSpec) -> Any:
    if key in spec.config:
        return spec.config[key]
    module, setting = config_setting(key)
    owner: Any = importlib.import_module(module)
    for part in setting.split("."):
        owner = getattr(owner, part, None)
    return owner


def no_stages(spec: JobSpec) -> str | None:
    """Why the spec's backend has nothing for the compiler bisector to bisect, if it has not."""
    if spec.backend in ("inductor", "aot_inductor"):
        return bisector.available()
    if spec.backend.count(":"):
        return (f"the custom backend {spec.backend} is opaque to torch's compiler bisector: it has no stages or "
                "subsystems to bisect (only inductor and aot_inductor have)")
    return (f"the {spec.backend} backend has no stages for torch's compiler bisector to bisect (only inductor "
            "and aot_inductor have)")


def budget_s(elapsed_s: float) -> float:
    """How long the phase may take, after a job that took `elapsed_s` so far: a share of it, and
    at least the floor (`MINIFY_CULPRIT_MIN_BUDGET_S` where the operator sets one)."""
    floor = float(os.environ.get(MIN_BUDGET_ENV) or MIN_BUDGET_S)
    return max(floor, BUDGET_FRACTION * elapsed_s)


PENDING_REASON = "pending: the culprit phase runs after the repro is delivered"


def report_fields(found: Found | None, spec: JobSpec) -> dict[str, Any]:
    """report.json's culprit_state, culprit, culprit_reason, workarounds and workarounds_tried, for
    a phase that found `found`, or (None) did not run."""
    if found is None:
        reason = ("not asked for (spec culprit: false)" if not spec.culprit
                  else "not run: the job ended before the culprit phase")
        return stopped_fields(CulpritState.skipped, reason)
    return {"culprit_state": CulpritState.done, "culprit": found.culprit, "culprit_reason": found.reason,
            "workarounds": found.workarounds, "workarounds_tried": found.tried}


def pending_fields() -> dict[str, Any]:
    """The same fields in the result delivered before the phase runs."""
    return stopped_fields(CulpritState.running, PENDING_REASON)


def stopped_fields(state: CulpritState, reason: str) -> dict[str, Any]:
    """The same fields for a phase that did not run (`skipped`), is `running`, or stopped
    (`cancelled`, `lost`), and why."""
    return {"culprit_state": state, "culprit": None, "culprit_reason": reason, "workarounds": [],
            "workarounds_tried": {}}


def pending_header_lines() -> list[str]:
    """repro.py's header lines while the phase runs (replaced when it ends)."""
    return [f"Culprit:          {PENDING_REASON} (report.json has it once done)"]


def stopped_header_lines(reason: str) -> list[str]:
    """repro.py's header lines for a phase that stopped before its finding."""
    return [f"Culprit:          none: {reason}"]


def header_lines(found: Found | None) -> list[str]:
    """repro.py's header lines for the phase's finding (none when it did not run)."""
    if found is None:
        return []
    culprit = (f"{culprit_text(found.culprit)} (torch's compiler bisector, on this program)"
               if found.culprit else f"none: {found.reason}")
    lines = [f"Culprit:          {culprit}"]
    if found.culprit and found.reason:
        lines.append(f"                  {found.reason}")
    if found.workarounds:
        lines += [f"Workaround:       {w.setting}={w.value!r} ({w.verified_on})" for w in found.workarounds]
    else:
        lines.append("Workarounds:      none verified")
    return lines


# ---------------------------------------------------------------------------------------------
# The phase, in the engine's process


def find(pool: SandboxPool, *, original: fx.Graph, minimal: fx.Graph, target: Signature, spec: JobSpec,
         timeout_s: float, budget: float, should_stop: Callable[[], str | None],
         say: Callable[[str], None]) -> Found:
    """The culprit phase; raises `scheduler.Stopped` when `should_stop` answers (a cancel)."""
    prober = _Prober(pool, spec, target, timeout_s, time.monotonic() + budget, should_stop)
    for key, why in known_failing(minimal, spec).items():
        prober.remember(key, Fails(target), why)
    minimal_wire = graph_to_wire(minimal)
    state_dir = Path(pool.workdir) / "bisect"
    reason = no_stages(spec)
    screens = {setting: _screen_key(setting, spec) for setting in settings(spec)}
    original_wire = graph_to_wire(original)
    for setting, key in screens.items():
        # A setting the minimal program passes with goes to the original at once, ahead of the rest:
        # a verified workaround is worth more than the last steps of a bisection the budget may cut.
        prober.on_pass[key] = (_verify_key(setting, spec), original_wire)
    if reason is None:
        # Started ahead, as slots free up: the bisection's likely probes, then the settings' screens.
        ahead = [_probe_key(probe, spec) for probe in bisector.expected_probes()]
        prober.offer([(key, minimal_wire, state_dir if key.bisect_env else None) for key in ahead])
    prober.offer([(key, minimal_wire, None) for key in screens.values()])
    found = Found(reason=reason)
    try:
        if reason is None:
            say("culprit: bisecting the compiler on the minimal program")
            found.culprit, found.reason = _bisect(prober, minimal_wire, spec, state_dir)
        passing = _screen(prober, screens, minimal_wire, found.tried)
        if passing:
            say(f"workarounds: trying {', '.join(_name(setting) for setting in passing)} on the original")
        found.workarounds = _verify(prober, original_wire, passing, spec, found.tried)
    except SandboxError as error:  # the fork server died under a probe: the phase ends, the job does not
        log.warning("the culprit phase lost its sandbox: %s", error)
        found.culprit, found.reason = None, f"the sandbox's fork server died during the culprit phase: {error}"
    finally:
        prober.close()
    return found


def known_failing(minimal: fx.Graph, spec: JobSpec) -> dict[_Key, str]:
    """Probes the job already answered, and how: the minimal program compiled with the job's own
    backend and config fails the job's way (the job verified it), and so does every probe that
    compiles exactly that (`bisector.same_as_last_stage`). None for a backend without stages."""
    if no_stages(spec) is not None:
        return {}
    known = {_Key("minimal", spec.backend): "the job's own run of the minimal program"}
    has_convolution = any("conv" in str(node.target) for node in minimal.nodes if node.op == "call_function")
    candidates = [probe for probe in bisector.expected_probes() if probe.subsystem]
    for probe in candidates:
        why = bisector.same_as_last_stage(probe, device_class=spec.device_class, has_convolution=has_convolution,
                                          setting=lambda key: _current_value(key, spec))
        if why is not None:
            known[_probe_key(probe, spec)] = f"{why}: the job's own run of the minimal program"
    return known


class _OutOfBudget(Exception):
    """The phase's budget ran out: the probes left are not run."""


class _Inconclusive(Exception):
    """A bisection probe hung, crashed or ran out of memory (not the job's failure) twice: the
    bisection stops there rather than guess which way it went."""


def _name(setting: tuple[str, Any]) -> str:
    key, value = setting
    return f"{key}={value}"


@dataclass(frozen=True)
class _Key:
    """What a probe compiles: the graph (minimal or original), the backend, config overrides, and
    the bisector's environment (empty unless a subsystem is being counted or disabled)."""

    graph: str
    backend: str
    config: tuple[tuple[str, Any], ...] = ()
    bisect_env: tuple[tuple[str, str], ...] = ()


def _probe_key(probe: bisector.Probe, spec: JobSpec) -> _Key:
    """What a bisector probe compiles. Its last stage is inductor, which an aot_inductor job
    compiles with aot_inductor; a config change is a config patch (the same compile as that
    setting's screen); a subsystem being disabled or counted goes by the environment protocol."""
    backend = spec.backend if probe.backend == bisector.FINAL_STAGE else probe.backend
    if probe.config:
        return _Key("minimal", backend, probe.config)
    return _Key("minimal", backend, (), tuple(sorted(probe.environment().items())) if probe.subsystem else ())


def _screen_key(setting: tuple[str, Any], spec: JobSpec, graph: str = "minimal") -> _Key:
    key, value = setting
    return _Key(graph, value) if key == BACKEND else _Key(graph, spec.backend, ((key, value),))


def _verify_key(setting: tuple[str, Any], spec: JobSpec) -> _Key:
    return _screen_key(setting, spec, "original")


class _Prober:
    """Probes in sandbox children, memoized by what they compile, bounded by a deadline. Probes
    offered ahead (`offer`) start while fewer than the pool's parallelism run."""

    def __init__(self, pool: SandboxPool, spec: JobSpec, target: Signature, timeout_s: float, deadline: float,
                 should_stop: Callable[[], str | None]) -> None:
        self.pool, self.spec, self.target, self.timeout_s = pool, spec, target, timeout_s
        self.deadline, self.should_stop = deadline, should_stop
        self.futures: dict[_Key, Future[Outcome]] = {}
        self.known: dict[_Key, str] = {}  # answered without a probe (`remember`), and how
        self.count = 0
        self.notes: list[str] = []
        self._ahead: list[tuple[_Key, dict[str, Any], Path | None]] = []
        # A probe to offer (first) once the probe of this key passes: a screen's check on the original.
        self.on_pass: dict[_Key, tuple[_Key, dict[str, Any]]] = {}
        self._closed = False
        self._lock = threading.RLock()

    def submit(self, key: _Key, wire_graph: dict[str, Any], state_dir: Path | None = None, *,
               again: bool = False, patience: float = 1.0) -> Future[Outcome]:
        """The probe's outcome: memoized unless `again` (run once more); `patience` multiplies its timeout."""
        with self._lock:
            if key in self.futures and not again:
                return self.futures[key]
            self.count += 1
            outer: Future[Outcome] = Future()
            self.futures[key] = outer
        kwargs = {"wire_graph": wire_graph, "backend": key.backend, "config": dict(key.config),
                  "bisect_env": dict(key.bisect_env) or None, "state_dir": str(state_dir) if state_dir else None}
        timeout_s = self.timeout_s * patience
        inner = self.pool.submit_call(CALL_TARGET, kwargs, timeout_s=timeout_s, purpose="culprit probe")
        inner.add_done_callback(lambda done: _settle_outcome(outer, done, timeout_s))
        outer.add_done_callback(lambda done: self.pool.cancel(inner) if done.cancelled() else self._done(key, done))
        return outer

    def remember(self, key: _Key, outcome: Outcome, why: str) -> None:
        """`key`'s outcome, known without running it (`why`)."""
        future: Future[Outcome] = Future()
        future.set_result(outcome)
        self.futures[key] = future
        self.known[key] = why

    def offer(self, probes: list[tuple[_Key, dict[str, Any], Path | None]], *, first: bool = False) -> None:
        """Probes to start ahead, in this order, as slots free up (`first`: before those offered so far)."""
        with self._lock:
            self._ahead[:0 if first else len(self._ahead)] = probes
        self._start_ahead()

    def _done(self, key: _Key, done: Future[Outcome]) -> None:
        follow = self.on_pass.get(key)
        if follow is not None and isinstance(done.result(), Passes):
            self.offer([(*follow, None)], first=True)
        else:
            self._start_ahead()

    def _start_ahead(self) -> None:
        with self._lock:
            while self._ahead and not self._closed and \
                    sum(not future.done() for future in self.futures.values()) < self.pool.parallelism:
                key, wire_graph, state_dir = self._ahead.pop(0)
                if key not in self.futures:
                    self.submit(key, wire_graph, state_dir)

    def wait(self, futures: list[Future[Outcome]]) -> None:
        """Wait for `futures`; `_OutOfBudget` past the deadline, `Stopped` on a stop."""
        from minify_worker.scheduler import Stopped

        pending = [future for future in futures if not future.done()]
        while pending:
            reason = self.should_stop()
            if reason:
                self.close()
                raise Stopped(reason)
            if time.monotonic() > self.deadline:
                raise _OutOfBudget()
            wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
            pending = [future for future in pending if not future.done()]

    def fails(self, outcome: Outcome) -> bool:
        return oracle.still_fails(outcome, self.target, self.spec.failure)

    def close(self) -> None:
        """Cancel every probe still queued or running (their children die)."""
        with self._lock:
            self._closed = True
            self._ahead.clear()
            running = [future for future in self.futures.values() if not future.done()]
        for future in running:
            future.cancel()


def _settle_outcome(outer: Future[Outcome], done: Future[dict[str, Any]], timeout_s: float) -> None:
    if outer.done():
        return
    if done.cancelled():
        outer.cancel()
        return
    error = done.exception()
    try:
        outer.set_result(_outcome_of_call_error(error, timeout_s) if error else outcome_from_dict(done.result()))
    except Exception:  # cancelled meanwhile
        pass


def _outcome_of_call_error(error: BaseException, timeout_s: float) -> Outcome:
    """A probe child that died, hung or ran out of memory, as the outcome a candidate would have."""
    if not isinstance(error, SandboxCallError):
        return Invalid(message=f"the probe could not run: {type(error).__name__}: {error}")
    message = str(error).split("failed in its child: ", 1)[-1]
    if error.error_type == "crashed":
        # The call's message is the crash's signature as str() writes it: a signal name, or an exit status.
        name, _, code = message.partition(": ")
        if name == "ExitStatus" and code.lstrip("-").isdigit():
            return Crashed(signal=0, signature=oracle.exit_signature(int(code)))
        number = getattr(signal.Signals, name, None)
        if number is not None:
            return Crashed(signal=int(number), signature=oracle.crash_signature(int(number)))
        return Crashed(signal=0, signature=Signature(kind="crash", exc_type="Crashed", key="", text=message))
    if error.error_type == "timed_out":
        return TimedOut(after_s=timeout_s)
    if error.error_type == "oom":
        return OutOfMemory(message=message)
    return Invalid(message=message)


def _describe(outcome: Outcome) -> str:
    signature = oracle.outcome_signature(outcome)
    return f"{outcome.kind} ({signature})" if signature is not None else outcome.kind


def _bisect(prober: _Prober, wire_graph: dict[str, Any], spec: JobSpec,
            state_dir: Path) -> tuple[Culprit | None, str | None]:
    """torch's bisection over probes of the minimal graph: (the culprit, or None and why)."""
    known: dict[str, str | None] = {"backend": None, "subsystem": None}

    def works(probe: bisector.Probe) -> bool:
        key = _probe_key(probe, spec)
        state = state_dir if key.bisect_env else None
        # Counting and bisecting read and write the bisector's state files: run every time.
        counting = probe.run_state in ("find_max_bounds", "bisect")
        future = prober.submit(key, wire_graph, state, again=counting)
        prober.wait([future])
        outcome = future.result()
        if _inconclusive(outcome):
            # A hang, a crash or an out-of-memory that is not the job's failure may be the machine's
            # doing (a loaded box, a slow compile): once more, with twice the time, before it counts.
            prober.notes.append(f"probe {probe.describe()}: {_describe(outcome)}; run again")
            future = prober.submit(key, wire_graph, state, again=True, patience=2.0)
            prober.wait([future])
            outcome = future.result()
            if _inconclusive(outcome):
                prober.notes.append(f"probe {probe.describe()}: {_describe(outcome)} again")
                raise _Inconclusive(f"probe {probe.describe()} neither passed nor failed the same way twice "
                                    f"({_describe(outcome)})")
        failing = prober.fails(outcome)
        if not failing and not isinstance(outcome, Passes):
            prober.notes.append(f"probe {probe.describe()}: {_describe(outcome)}; counted as not failing the same way")
        if failing and probe.subsystem is None:
            known["backend"] = probe.backend
        if not failing and probe.run_state == "test_disable":
            known["subsystem"] = probe.subsystem
        return not failing

    def _inconclusive(outcome: Outcome) -> bool:
        return not isinstance(outcome, Passes | Fails) and not prober.fails(outcome)

    try:
        result = bisector.bisect(works, state_dir)
    except _OutOfBudget:
        return _partial(known, prober, "the phase's time budget ran out")
    except _Inconclusive as inconclusive:
        return _partial(known, prober, str(inconclusive))
    except RuntimeError as error:  # the bisector's own consistency checks (a probe that flipped)
        return _partial(known, prober, f"the bisector stopped: {error}")
    if result is None:
        return None, (f"the minimal program did not fail the same way in any stage of the compiler bisector "
                      f"({prober.count} probes)")
    detail = result.debug_info
    config = dict(bisector.config_patch(result.backend, result.subsystem))
    if config:
        detail = ", ".join(f"{key}={value} avoids it" for key, value in config.items())
    return Culprit(backend=result.backend, subsystem=result.subsystem, bisect_number=result.bisect_number,
                   detail=detail, graph=_compiled_graph(result.backend), probes=prober.count,
                   notes=list(prober.notes)), None


def _compiled_graph(stage: str) -> Literal["forward"] | None:
    """Which graph the culprit's stage failed on: the last stage (inductor, aot_inductor) compiles
    under no_grad (backends.py), so the forward graph is the only one there is; the earlier stages
    (aot_autograd backends) could trace a backward too, which minify does not tell apart."""
    return "forward" if stage == bisector.FINAL_STAGE else None


def _partial(known: dict[str, str | None], prober: _Prober, why: str) -> tuple[Culprit | None, str]:
    reason = f"bisection incomplete after {prober.count} probes: {why}"
    if known["backend"] is None:
        return None, reason
    return Culprit(backend=known["backend"], subsystem=known["subsystem"], graph=_compiled_graph(known["backend"]),
                   probes=prober.count, notes=list(prober.notes)), reason


def _screen(prober: _Prober, screens: dict[tuple[str, Any], _Key], wire_graph: dict[str, Any],
            tried: dict[str, str]) -> list[tuple[str, Any]]:
    """The settings under which the minimal program passes (what else happened goes to `tried`)."""
    futures = {setting: prober.submit(key, wire_graph) for setting, key in screens.items()}
    try:
        prober.wait(list(futures.values()))
    except _OutOfBudget:
        pass
    passing = []
    for setting, future in futures.items():
        if not future.done():
            tried[_name(setting)] = "not tried: the phase's time budget ran out"
        elif isinstance(future.result(), Passes):
            passing.append(setting)
        else:
            known = prober.known.get(screens[setting])
            tried[_name(setting)] = f"minimal program: {_describe(future.result())}" + (
                f" (known without a probe: {known})" if known else "")
    return passing


def _verify(prober: _Prober, wire_graph: dict[str, Any], passing: list[tuple[str, Any]], spec: JobSpec,
            tried: dict[str, str]) -> list[Workaround]:
    """The settings under which the original compiles and runs (within tolerance, for accuracy)."""
    futures = {setting: prober.submit(_verify_key(setting, spec), wire_graph) for setting in passing}
    try:
        prober.wait(list(futures.values()))
    except _OutOfBudget:
        pass
    checked = ("compiles and runs within tolerance "
               f"{spec.failure.tolerance} of eager" if spec.failure.kind == "accuracy" else "compiles and runs")
    verified = []
    for (key, value), future in futures.items():
        if not future.done():
            tried[f"{key}={value}"] = "minimal program: passes; original: not tried, the phase's time budget ran out"
        elif isinstance(future.result(), Passes):
            verified.append(Workaround(setting=key, value=value, verified_on=f"original program: {checked}"))
        else:
            tried[f"{key}={value}"] = f"minimal program: passes; original: {_describe(future.result())}"
    return verified


# ---------------------------------------------------------------------------------------------
# In the sandbox child


def probe_in_child(context: Any, *, wire_graph: dict[str, Any], backend: str, config: dict[str, Any],
                   bisect_env: dict[str, str] | None = None, state_dir: str | None = None) -> dict[str, Any]:
    """A `SandboxPool.call` target: compile and run `wire_graph` with `backend` and the job's
    config plus `config`, under the bisector's environment when given; the outcome as a dict."""
    from minify_worker.runner import build_candidate, run_candidate

    if bisect_env is not None:
        assert state_dir is not None
        bisector.enter_probe(bisect_env, Path(state_dir))
    spec = context.spec.model_copy(update={"backend": backend, "config": {**context.spec.config, **config}})
    try:
        gm, inputs = build_candidate(wire_graph, context.values)
    except Exception as error:
        return outcome_to_dict(Invalid(message=f"cannot build the probe: {type(error).__name__}: {error}"))
    return outcome_to_dict(run_candidate(gm, inputs, spec, Path(tempfile.gettempdir())))
