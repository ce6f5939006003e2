"""The culprit phase, in the engine's process (`find`): torch's compiler bisector over probes of
the minimal graph, then each setting screened on the minimal graph and verified on the original,
within the phase's budget (`budget_s`)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch.fx as fx

from minify_contract.models import Culprit, JobSpec, Workaround
from minify_worker import oracle
from minify_worker.outcomes import Fails, Outcome, Passes, Signature
from minify_worker.programs.culprit import Found
from minify_worker.programs.fx import bisector
from minify_worker.programs.fx.culprit.prober import Key, OutOfBudget, Prober, probe_key, screen_key, verify_key
from minify_worker.programs.fx.culprit.workarounds import current_value, no_stages, settings
from minify_worker.programs.fx.graph import graph_to_wire
from minify_worker.sandbox import SandboxError

if TYPE_CHECKING:
    from minify_worker.engine.evaluator import SandboxEvaluator

log = logging.getLogger(__name__)

# The phase may take this share of the job's time to the result, and never less than the floor.
# It runs after the result is delivered, so the budget bounds the worker's time, not the user's
# wait: the floor lets a whole bisection (about 17 probes of the minimal graph, 11 s on the quiet
# 2-core box, 15-20 s with it loaded 8x, where a 20 s floor cut one in two) finish.
BUDGET_FRACTION = 0.2
MIN_BUDGET_S = 60.0
MIN_BUDGET_ENV = "MINIFY_CULPRIT_MIN_BUDGET_S"
# A budget whatever the job took, where the operator sets one: the phase's time known in advance.
BUDGET_ENV = "MINIFY_CULPRIT_BUDGET_S"


def budget_s(elapsed_s: float) -> float:
    """How long the phase may take, after a job that took `elapsed_s` so far: a share of it, and
    at least the floor (`MINIFY_CULPRIT_MIN_BUDGET_S` where the operator sets one); or exactly
    `MINIFY_CULPRIT_BUDGET_S` where the operator sets that."""
    fixed = os.environ.get(BUDGET_ENV)
    if fixed:
        return float(fixed)
    floor = float(os.environ.get(MIN_BUDGET_ENV) or MIN_BUDGET_S)
    return max(floor, BUDGET_FRACTION * elapsed_s)


def find(evaluator: SandboxEvaluator, *, original: fx.Graph, minimal: fx.Graph, target: Signature, spec: JobSpec,
         timeout_s: float, budget: float, should_stop: Callable[[], str | None],
         say: Callable[[str], None]) -> Found:
    """The culprit phase, its probes run through the job's `evaluator`; raises `outcomes.Stopped`
    when `should_stop` answers (a cancel)."""
    prober = Prober(evaluator, spec, target, timeout_s, time.monotonic() + budget, should_stop)
    for key, why in known_failing(minimal, spec).items():
        prober.remember(key, Fails(target), why)
    minimal_wire = graph_to_wire(minimal)
    state_dir = Path(evaluator.pool.workdir) / "bisect"
    reason = no_stages(spec)
    screens = {setting: screen_key(setting, spec) for setting in settings(spec)}
    original_wire = graph_to_wire(original)
    for setting, key in screens.items():
        # A setting the minimal program passes with goes to the original at once, ahead of the rest:
        # a verified workaround is worth more than the last steps of a bisection the budget may cut.
        prober.on_pass[key] = (verify_key(setting, spec), original_wire)
    if reason is None:
        # Started ahead, as slots free up: the bisection's likely probes, then the settings' screens.
        ahead = [probe_key(probe, spec) for probe in bisector.expected_probes()]
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
    except SandboxError as error:  # the sandbox failed past the evaluator's restarts: the phase ends, the job does not
        log.warning("the culprit phase lost its sandbox: %s", error)
        found.culprit, found.reason = None, f"the sandbox's fork server died during the culprit phase: {error}"
    finally:
        prober.close()
    return found


def known_failing(minimal: fx.Graph, spec: JobSpec) -> dict[Key, str]:
    """Probes the job already answered, and how: the minimal program compiled with the job's own
    backend and config fails the job's way (the job verified it), and so does every probe that
    compiles exactly that (`bisector.same_as_last_stage`). None for a backend without stages."""
    if no_stages(spec) is not None:
        return {}
    known = {Key("minimal", spec.backend): "the job's own run of the minimal program"}
    has_convolution = any("conv" in str(node.target) for node in minimal.nodes if node.op == "call_function")
    candidates = [probe for probe in bisector.expected_probes() if probe.subsystem]
    for probe in candidates:
        why = bisector.same_as_last_stage(probe, device_class=spec.device_class, has_convolution=has_convolution,
                                          setting=lambda key: current_value(key, spec))
        if why is not None:
            known[probe_key(probe, spec)] = f"{why}: the job's own run of the minimal program"
    return known


class _Inconclusive(Exception):
    """A bisection probe hung, crashed or ran out of memory (not the job's failure) twice: the
    bisection stops there rather than guess which way it went."""


def _name(setting: tuple[str, Any]) -> str:
    key, value = setting
    return f"{key}={value}"


def _describe(outcome: Outcome) -> str:
    signature = oracle.outcome_signature(outcome)
    return f"{outcome.kind} ({signature})" if signature is not None else outcome.kind


def _bisect(prober: Prober, wire_graph: dict[str, Any], spec: JobSpec,
            state_dir: Path) -> tuple[Culprit | None, str | None]:
    """torch's bisection over probes of the minimal graph: (the culprit, or None and why)."""
    known: dict[str, str | None] = {"backend": None, "subsystem": None}

    def works(probe: bisector.Probe) -> bool:
        key = probe_key(probe, spec)
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
    except OutOfBudget:
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


def _partial(known: dict[str, str | None], prober: Prober, why: str) -> tuple[Culprit | None, str]:
    reason = f"bisection incomplete after {prober.count} probes: {why}"
    if known["backend"] is None:
        return None, reason
    return Culprit(backend=known["backend"], subsystem=known["subsystem"], graph=_compiled_graph(known["backend"]),
                   probes=prober.count, notes=list(prober.notes)), reason


def _screen(prober: Prober, screens: dict[tuple[str, Any], Key], wire_graph: dict[str, Any],
            tried: dict[str, str]) -> list[tuple[str, Any]]:
    """The settings under which the minimal program passes (what else happened goes to `tried`)."""
    futures = {setting: prober.submit(key, wire_graph) for setting, key in screens.items()}
    try:
        prober.wait(list(futures.values()))
    except OutOfBudget:
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


def _verify(prober: Prober, wire_graph: dict[str, Any], passing: list[tuple[str, Any]], spec: JobSpec,
            tried: dict[str, str]) -> list[Workaround]:
    """The settings under which the original compiles and runs (within tolerance, for accuracy)."""
    futures = {setting: prober.submit(verify_key(setting, spec), wire_graph) for setting in passing}
    try:
        prober.wait(list(futures.values()))
    except OutOfBudget:
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
