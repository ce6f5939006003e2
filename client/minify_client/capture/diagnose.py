"""A failure no captured graph holds, diagnosed (opt-in: `MINIFY_CAPTURE_DIAGNOSE=1`, or the
runner's `--diagnose`): which layer of torch.compile is to blame, and what to do next.

Some failures under torch.compile are in no graph a compiler receives: dynamo replaying a value it
saw while tracing, a side effect it dropped, AOT autograd's runtime wrapper rebuilding an aliased
input's view. The test fails, and nothing is captured. For such a test (or script), run after it
failed and compiled something, it is run again in a child process, as torch's compiler bisector
runs its stages, the backend of every `torch.compile` call overridden through the bisector's own
variable (`TORCH_BISECT_BACKEND`, read by torch.compile itself):

1. with `TORCHDYNAMO_DISABLE=1` (no torch.compile at all): fails → the program's own failure,
   not the compiler's; unless it fails inside `torch.export`, which the program calls itself and
   that setting does not turn off (the rerun says where the error was raised): then torch.export;
2. with backend `eager` (dynamo alone): fails → dynamo;
3. with backend `aot_eager` (dynamo and AOT autograd, no compiler): fails → AOT autograd;
4. with the user's own backend again: fails → that backend's compiled code; passes → the failure
   needs what ran before it in the process (another test's state), or is flaky.

The reruns stop at the first that fails (or times out, or cannot run: then no layer is named).
The verdict, the next step and every rerun's outcome go to `DIR/diagnoses.json` (one entry per
test, the latest), each rerun's output to `DIR/diagnoses/<name>/<setting>.log`, and the message
to the runner's output or the plugin's summary. The user's own run has ended by then: its outcome is never changed.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from . import crash, rerun, torch_hooks
from .torch_hooks import ACCURACY_ENV

logger = logging.getLogger(__name__)

DIAGNOSE_ENV = "MINIFY_CAPTURE_DIAGNOSE"
MANIFEST = "diagnoses.json"
Layer = Literal["program", "export", "dynamo", "aot_autograd", "backend", "not_alone"]
Outcome = Literal["passes", "fails the same way", "fails differently", "timed out", "could not run"]

# (setting, what it changes in the rerun's environment), in the order of torch's layers.
_STAGES: tuple[tuple[str, dict[str, str]], ...] = (
    ("no torch.compile", {"TORCHDYNAMO_DISABLE": "1"}),
    ("eager", {"TORCH_BISECT_BACKEND": "eager"}),
    ("aot_eager", {"TORCH_BISECT_BACKEND": "aot_eager"}),
    ("your backend", {}),
)
_BLAME: dict[str, Layer] = {"no torch.compile": "program", "eager": "dynamo", "aot_eager": "aot_autograd",
                            "your backend": "backend"}
_NEXT: dict[str, str] = {  # by layer, and "export_refusal" for export's refusals
    "program": "it fails without torch.compile too (TORCHDYNAMO_DISABLE=1): the failure is the program's own, "
               "not the compiler's; there is nothing for minify to shrink.",
    "export": "it fails without torch.compile too (TORCHDYNAMO_DISABLE=1), inside torch.export, which the program "
              "calls itself and which that setting does not turn off: torch.export is to blame, not torch.compile "
              "(an error of export's own, not one of the refusals by which export asks a program to change: "
              "UserError, Unsupported, a guard on data-dependent values). No graph was exported, so there is "
              "nothing for minify to shrink. Next: export with strict=False (no dynamo tracing) tells dynamo's "
              "tracing from export's own passes; `minify-client reduce {reduce}` shrinks it to the smallest "
              "that still fails so and passes with torch.export handing back the module as it is; report it "
              "to PyTorch (module: export) with this test or script as the repro.",
    "export_refusal": "it fails without torch.compile too (TORCHDYNAMO_DISABLE=1), inside torch.export, which the "
                      "program calls itself: torch.export refused the program as written ({refusal}), which is "
                      "export asking the program to change ({remedies}), not a bug of torch.export or "
                      "torch.compile. Nothing for minify to shrink, and nothing to report as a bug. Where you "
                      "hold that export should take the program, `minify-client reduce {reduce}` shrinks it to "
                      "the smallest program export refuses so, for a feature request.",
    "dynamo": "it fails with backend 'eager' (dynamo alone: no AOT autograd, no compiler), so dynamo is to blame: "
              "what it traced (a value it saw while tracing and replays, a guard it did not install, a side "
              "effect it dropped, a NumPy or Python call it turned into torch ops that follow other rules, as "
              "NumPy's result dtypes: the graph then computes what dynamo wrote, compiled or not). No graph "
              "holds such a failure, so there is nothing for minify to shrink. "
              "Next: TORCH_LOGS=guards,recompiles,graph_code shows what dynamo traced and guarded; `minify-client "
              "reduce {reduce}` shrinks it to the smallest that still fails so; report it to PyTorch (module: "
              "dynamo) with this test or script as the repro.",
    "aot_autograd": "it passes with backend 'eager' and fails with 'aot_eager' (dynamo and AOT autograd, no "
                    "compiler), so AOT autograd is to blame: functionalization, or its runtime wrappers (input "
                    "mutations written back, aliased inputs and outputs rebuilt as views), which are in no graph. "
                    "Next: TORCH_LOGS=aot_graphs shows its graphs; {aot_capture}`minify-client reduce {reduce}` "
                    "shrinks it to the smallest that still fails so; report it to PyTorch (module: "
                    "aotdispatch) with this test or script as the repro.",
    "backend": "it passes with backends 'eager' and 'aot_eager' and fails with yours, so your backend's compiled "
               "code is to blame, though no graph was captured: the failure is not an error while compiling. "
               "Next: {backend_capture}for inductor, `python -m torch._inductor.compiler_bisector` names the pass.",
    "not_alone": "it passes when it runs again alone with your backend: it needs what ran before it in the same "
                 "process (state another test or call left behind), or it is flaky. Next: run it alone; if it "
                 "passes, find the test that must run before it.",
}


@dataclass
class Rerun:
    setting: str
    outcome: Outcome
    signature: str | None
    seconds: float
    log: str  # relative to the capture directory
    raised_in: str | None = None  # the torch module the program called when it failed ("torch.export")


@dataclass
class Diagnosis:
    test: str
    signature: str
    layer: Layer | None  # None: no rerun could say (each timed out or could not run)
    message: str
    reruns: list[Rerun] = field(default_factory=list)


def requested() -> bool:
    return os.environ.get(DIAGNOSE_ENV) == "1"


def rerun_timeout_s(seconds: float) -> float:
    """How long one rerun may take: five times the user's run, and five minutes more (a loaded
    machine's torch import and compiles vary that much)."""
    return 5 * seconds + 300


@dataclass(frozen=True)
class RerunCommand:
    """What a rerun runs: `argv`, `rerun.main`'s arguments (the script and its own, or `--pytest
    NODEID ...`), from `cwd`; `sources`, the files whose imports decide what one server imports for
    every stage (`rerun.preloaded_modules`)."""

    argv: tuple[str, ...]
    cwd: Path
    sources: tuple[Path, ...]
    pytest: bool = False

    def fresh(self) -> list[str]:
        """A fresh interpreter running it: rerun.py by its path (`-m minify_client.capture.rerun`
        would first import the client's packages, httpx, pydantic, rich: 0.7 CPU-s a rerun, none of
        which a rerun uses)."""
        import sys

        return [sys.executable, "-c", rerun.BY_PATH, rerun.__file__, *self.argv]

    def preload(self) -> list[str]:
        """What one fork server imports before the stages fork from it (torch: seconds a rerun
        otherwise); none where a source cannot be read or may change the environment."""
        return rerun.server_modules(self.sources, pytest=self.pytest)


def script_command(script: str, args: Sequence[str], cwd: str | os.PathLike[str]) -> RerunCommand:
    """The script run again as `python script.py args` ran it from `cwd`."""
    return RerunCommand(argv=(script, *args), cwd=Path(cwd), sources=(Path(cwd) / script,))


def pytest_command(nodeid: str, rootdir: Path, inifile: Path | None) -> RerunCommand:
    """One test again, from `rootdir` (where its node id starts) with the run's own ini file; its
    file and the conftest.py files pytest loads for it decide what a server may import first."""
    config = ("-c", str(inifile)) if inifile is not None else ()
    test_file = rootdir / nodeid.split("::", 1)[0]
    return RerunCommand(argv=("--pytest", nodeid, *config, f"--rootdir={rootdir}", "-p", rerun.PLUGIN, "-p",
                              "no:cacheprovider", "-q", "-W", "ignore::pytest.PytestAssertRewriteWarning"),
                        cwd=rootdir, sources=(test_file, *rerun.conftests(test_file, rootdir)), pytest=True)


class Servers:
    """The rerun servers (`rerun.Server`) that diagnoses share, one for each list of modules a
    program's sources have it import (`RerunCommand.preload`), started when a rerun first needs it:
    a pytest run's failures in files that import the same torch modules fork from one. A server
    runs no program itself (each rerun is a child of it), so one test's reruns leave nothing for the
    next. Close it (or use it as a context manager) when the diagnoses are done."""

    def __init__(self) -> None:
        self._started: dict[tuple[str, ...], rerun.Server | None] = {}

    def __enter__(self) -> Servers:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def get(self, modules: Sequence[str], cwd: Path) -> rerun.Server | None:
        """The server that imported `modules`, started from `cwd` if none is running; None for no
        modules (the program's reruns are fresh interpreters) or where it cannot start."""
        if not modules:
            return None
        key = tuple(modules)
        server = self._started.get(key)
        if key in self._started and (server is None or server.alive()):  # None: it could not start, nor will it
            return server
        try:
            server = rerun.Server(list(modules), cwd=cwd, environment=rerun.environment({}))
        except OSError:
            server = None
        self._started[key] = server
        return server

    def close(self) -> None:
        for server in self._started.values():
            if server is not None:
                server.close()
        self._started.clear()


def diagnose(test: str, signature: str, command: RerunCommand, *, directory: Path, name: str,
             timeout_s: float, servers: Servers | None = None) -> Diagnosis:
    """Rerun `command` (script_command or pytest_command) stage by stage until one fails; the
    verdict, written to `directory`. The stages fork from a server that imported torch once
    (`rerun.serve`) where the program's sources allow (`RerunCommand.preload`): the variables a stage
    sets, torch reads at each torch.compile, not on import (`rerun._settings_read_on_import`). Taken
    from `servers` where given (diagnoses that share them), else started for this diagnosis alone."""
    logs = directory / "diagnoses" / name
    logs.mkdir(parents=True, exist_ok=True)
    if not backend_override_read():
        diagnosis = Diagnosis(test=test, signature=signature, layer=None,
                              message="minify: no graph captured holds this failure; this torch's torch.compile does "
                                      "not read TORCH_BISECT_BACKEND, so the reruns cannot say which layer is to blame")
        _record(directory, diagnosis)
        return diagnosis
    reruns: list[Rerun] = []
    shared = servers if servers is not None else Servers()
    server = shared.get(command.preload(), command.cwd)
    try:
        for setting, environment in _STAGES:
            done = _rerun(setting, environment, command, server, log=logs / f"{setting.replace(' ', '-')}.log",
                          directory=directory, expected=signature, timeout_s=timeout_s)
            reruns.append(done)
            if done.outcome != "passes":  # a rerun that fails names the layer; one that did not finish ends it
                break
    finally:
        if servers is None:
            shared.close()
    diagnosis = _verdict(test, signature, reruns)
    _record(directory, diagnosis)
    return diagnosis


def refused_before_compile(error: BaseException) -> str | None:
    """The note for a failure that dynamo raised before any graph reached a backend (an unsupported
    construct under fullgraph, a higher-order op it cannot capture): no graph exists to capture or
    to rerun with other backends, so the layer is known from the error alone. None for any other
    error, and for dynamo's `BackendCompilerFailed`, which wraps the error of a compiler a graph reached."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if type(current).__name__ == "BackendCompilerFailed":  # dynamo's wrapper of a compiler's own error
            return None
        if type(current).__module__.startswith("torch._dynamo"):
            said = _graph_break_said(str(current))
            return (f"minify: dynamo refused the program before any graph reached a compiler "
                    f"({type(current).__name__}{': ' + said if said else ''}), so there is no graph to capture or "
                    "to minimize. Next: where dynamo's hint names a setting, run the program with it set (a capture "
                    "carries the settings to the worker); else, if the program is valid PyTorch, report it to "
                    "PyTorch (module: dynamo) with this test or script as the repro.")
        current = current.__cause__ or current.__context__
    return None


def _graph_break_said(message: str) -> str:
    """The first `Explanation:` and `Hint:` lines of a dynamo graph-break message (torch 2.13 writes
    them under the break's name: "Operator `aten.nonzero.default`'s output shape depends on input
    Tensor data", "Enable tracing of dynamic shape operators with
    `torch._dynamo.config.capture_dynamic_output_shape_ops = True`"); "" when it has neither."""
    found: dict[str, str] = {}
    for line in message.splitlines():
        label, _, text = line.strip().partition(": ")
        if label in ("Explanation", "Hint") and text and label not in found:
            found[label] = text.strip().rstrip(".")
    return "; ".join(f"{'hint: ' if label == 'Hint' else ''}{text}" for label, text in found.items())


def graph_breaks() -> list[str]:
    """The reasons dynamo broke graphs for in this process (its `graph_break` counters), first line each."""
    import sys

    if "torch._dynamo" not in sys.modules:
        return []
    from torch._dynamo.utils import counters

    return [str(reason).strip().splitlines()[0] for reason in counters["graph_break"] if str(reason).strip()]


def rounding_amplified(inexact: Sequence[str], breaks: Sequence[str]) -> str | None:
    """The note for a program that failed with nothing captured after dynamo broke it into graphs
    whose outputs the accuracy check passed though not bit for bit (`torch_hooks.passed_inexact`):
    eager code after a break that compares or counts exact values turns differences within the
    tolerance into another result (pytorch#148859: 2201 values out of `unique_consecutive`, eager
    2224). None without both."""
    if not inexact or not breaks:
        return None
    return (f"minify: the compiled graphs passed the accuracy check, though not bit for bit ({inexact[0]}, within "
            f"the tolerance), and dynamo broke the program into graphs ({breaks[0]}): eager code after a graph "
            "that compares or counts exact values (unique, nonzero, a floor, ==) can turn such differences into "
            "this failure, which no graph holds: none is wrong by torch's accuracy rule, so none is captured. "
            "Next: with the op in the graph (torch._dynamo.config.capture_dynamic_output_shape_ops = True for "
            "one whose size the values decide) the accuracy check judges it; or compute those values in float64")


def backend_override_read() -> bool:
    """Whether torch.compile takes its backend from the compiler bisector (`TORCH_BISECT_BACKEND`):
    read in its source, as torch 2.13 has it (`CompilerBisector.get_backend()` in torch.compile)."""
    import inspect

    import torch

    try:
        return "CompilerBisector.get_backend()" in inspect.getsource(torch.compile)
    except (OSError, TypeError):  # no source shipped: assume the documented behaviour
        return True


def _verdict(test: str, signature: str, reruns: list[Rerun]) -> Diagnosis:
    last = reruns[-1]
    if last.outcome in ("fails the same way", "fails differently"):
        layer: Layer | None = _BLAME[last.setting]
        if layer == "program" and rerun.raised_inside_export(last.raised_in):
            layer = "export"
    elif last.setting == "your backend" and last.outcome == "passes":
        layer = "not_alone"
    else:
        layer = None
    if layer is None:
        text = ("minify: no graph captured holds this failure, and the reruns that would say which layer of "
                f"torch.compile is to blame did not finish ({last.setting}: {last.outcome}).")
    else:
        differently = (f" (with {last.setting} it fails differently: {last.signature})"
                       if last.outcome == "fails differently" else "")
        # A test by its node id, as `reduce` takes it (a script's name here is not its path).
        target = test if "::" in test else "SCRIPT"
        text = (f"minify: no graph captured holds this failure ({signature}); "
                f"{_next_step(layer, target, rerun.export_refusal(last.signature))}{differently}")
    return Diagnosis(test=test, signature=signature, layer=layer, message=text, reruns=reruns)


def _next_step(layer: Layer, reduce_target: str = "SCRIPT", export_refusal: str | None = None) -> str:
    """The layer's next step, naming only the capture options this run did not have on already (the
    user's run and the diagnosis share the process: its environment is the run's). A failure inside
    torch.export that is one of its refusals (`rerun.export_refusal`) is the program's to change."""
    if layer == "export" and export_refusal is not None:
        return _NEXT["export_refusal"].format(refusal=export_refusal, reduce=reduce_target,
                                              remedies=rerun.EXPORT_REFUSAL_REMEDIES)
    accuracy = os.environ.get(ACCURACY_ENV) == "1"
    aot_level = os.environ.get("MINIFY_CAPTURE_LEVEL") == "aot"
    crash_capture = crash.requested()
    found_none = _found_none()
    if accuracy and aot_level and not torch_hooks.skipped_checks:
        aot_capture = (f"the accuracy check was on at the aot level and {found_none}, so "
                       "the wrong values are made outside the graphs (its runtime wrappers): ")
    else:
        aot_capture = ("if the wrong values are in one, MINIFY_CAPTURE_LEVEL=aot MINIFY_CAPTURE_ACCURACY=1 "
                       "captures it; else ")
    options = []
    if not accuracy:
        options.append("MINIFY_CAPTURE_ACCURACY=1 captures a graph whose outputs are wrong (with "
                       "MINIFY_CAPTURE_LEVEL=aot, the graph after AOT autograd)")
    elif not aot_level:
        options.append(f"the accuracy check was on and {found_none}: MINIFY_CAPTURE_LEVEL=aot "
                       "checks each graph after AOT autograd, as the backend received it")
    else:
        options.append(f"the accuracy check was on at the aot level and {found_none}: "
                       "the failure is within the tolerance and amplified by the program, or not in values (an "
                       "error or warning the compiled code did not raise)")
    if not crash_capture:
        options.append("MINIFY_CAPTURE_CRASH=1 captures one whose run kills the process")
    return _NEXT[layer].format(aot_capture=aot_capture, backend_capture="; ".join(options) + "; ",
                               reduce=reduce_target)


def _found_none() -> str:
    """What the accuracy check found: nothing wrong, or nothing wrong where it could judge."""
    skipped = torch_hooks.skipped_checks
    if not skipped:
        return "found no graph wrong by torch's rule"
    return (f"found no graph wrong by torch's rule among those it could judge; it could not judge "
            f"{'a graph' if len(skipped) == 1 else 'graphs'} ({'; '.join(skipped[:2])}), and the wrong values "
            "may be there (a limit of minify's check, not your program's)")


def _rerun(setting: str, environment: dict[str, str], command: RerunCommand, server: rerun.Server | None, *,
           log: Path, directory: Path, expected: str, timeout_s: float) -> Rerun:
    handle, out = tempfile.mkstemp(prefix="minify-rerun-", suffix=".json")
    os.close(handle)
    started = time.monotonic()
    try:
        ended = None
        if server is not None:
            ended = server.run({"argv": list(command.argv), "cwd": str(command.cwd), "out": out, "log": str(log),
                                "timeout_s": timeout_s, "settings": environment})
        if ended is not None and ended["timed_out"]:
            return Rerun(setting, "timed out", None, time.monotonic() - started, _relative(log, directory))
        returncode = None if ended is None else int(ended["returncode"])
        if returncode is None:  # no server, or it died: a fresh interpreter
            env = rerun.environment({**environment, rerun.OUT_ENV: out})
            with open(log, "w") as output:
                try:
                    done = subprocess.run(command.fresh(), cwd=command.cwd, env=env, stdout=output,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=timeout_s,
                                          check=False)
                except subprocess.TimeoutExpired:
                    return Rerun(setting, "timed out", None, time.monotonic() - started, _relative(log, directory))
                except OSError as error:
                    output.write(f"minify: could not start {command.fresh()[0]}: {error}\n")
                    return Rerun(setting, "could not run", None, time.monotonic() - started,
                                 _relative(log, directory))
            returncode = done.returncode
        outcome, signature, raised_in = _outcome(returncode, out, expected)
        return Rerun(setting, outcome, signature, time.monotonic() - started, _relative(log, directory), raised_in)
    finally:
        os.unlink(out)


def _outcome(returncode: int, out: str, expected: str) -> tuple[Outcome, str | None, str | None]:
    written = rerun.read_record(out)
    if written is None:
        # Nothing written: a script that ended without a word, or pytest with no failing test.
        if returncode == 0:
            return "passes", None, None
        if returncode < 0:
            from .crash import death_signature

            return "fails differently", death_signature(returncode), None
        return "could not run", None, None  # pytest's usage errors, no test collected, an internal error
    if not written.get("failed"):
        return "passes", None, None
    signature = written.get("signature")
    return ("fails the same way" if signature == expected else "fails differently"), signature, written.get("raised_in")


def _relative(path: Path, directory: Path) -> str:
    try:
        return str(path.relative_to(directory))
    except ValueError:
        return str(path)


def _record(directory: Path, diagnosis: Diagnosis) -> None:
    """Put `diagnosis` in DIR/diagnoses.json (replacing that test's earlier one), under the capture
    directory's lock, as the capture manifest is written."""
    from .session import _directory_lock

    with _directory_lock(directory):
        entries = [entry for entry in read_diagnoses(directory) if entry.get("test") != diagnosis.test]
        entries.append(asdict(diagnosis))
        path = directory / MANIFEST
        temporary = path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps({"diagnoses": entries}, indent=2) + "\n")
        temporary.replace(path)


def read_diagnoses(directory: str | os.PathLike[str]) -> list[dict]:
    """The entries of `directory`'s diagnoses.json (empty when there is none)."""
    try:
        return list(json.loads((Path(directory) / MANIFEST).read_text()).get("diagnoses", []))
    except (OSError, ValueError):
        return []
