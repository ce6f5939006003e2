"""Run the real-bug corpus the user's way, ours against torch's minifier (issue 38).

    .venv/bin/python bench/realbugs/run.py [--cases pt_175966 ...] [--sides ours torch]
                                           [--work out/realbugs] [--json FILE] [--markdown FILE]

Per case (bench/realbugs/pt_*.py), each step a whole process with its own time limit:

1. capture: `python -m minify_client.capture --dir CAPTURES script.py`, with `MINIFY_CAPTURE_ACCURACY=1`
   where the script compares values (wrong values, missing error), `MINIFY_CAPTURE_CRASH=1` where it
   dies, `MINIFY_CAPTURE_HANG=HANG_S` where it hangs (the opt-ins a user reaches for after seeing that
   failure);
2. ours: `minify-worker minify CAPTURE.pt2 --spec spec.json --inputs inputs.pt --out OUT` (the capture's
   own spec and inputs; the version and culprit phases off, they do not change the repro);
3. `python OUT/repro.py`: it must fail, and its "repro failed with:" line must equal its
   "minify expected:" line (the same signature); a crash must die by the same signal; a hang's must
   still be running at HANG_S;
4. reduce, where step 1 captured nothing (instead of 2 and 3): `minify-client reduce SCRIPT --out OUT
   --budget LIMIT` on a copy of the script in the case's folder, what a user runs after the capture's
   diagnosis; then `python OUT` must fail with the script's exception type in each of 3 runs (each
   with an empty inductor cache) and pass with `TORCHDYNAMO_DISABLE=1` (the reduction's claim,
   checked by processes of our own);
5. torch: the same script with `TORCHDYNAMO_REPRO_AFTER=aot` (`TORCHDYNAMO_REPRO_LEVEL=4` for wrong
   values, 3 for crashes: after_aot's levels for them), then `python minifier_launcher.py minify
   --no-isolate` (`--isolate`, torch's default, for crashes only: a fresh Python per check costs more
   than this bench can give every case), then `python repro.py`: does it fail, and how many ops are left.

With `--torch-envs VENV...` (other torch installations: venv folders or interpreters), two more
columns: the torch versions the case's own script fails on (the script run under each, the job's
own torch first), and what our version phase finds (repro.py under each: `minify-worker minify`
with `MINIFY_TORCH_ENVS`, the version phase on): which versions have the bug, the regression range
and the version that fixed it, as a job reports them.

Every case ends with a verdict per side: "minimal repro" or the exact reason it is not one. The
results go to `--json` (every field) and `--markdown` (the table docs/bench.md quotes). Imports no torch.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))  # bench/: the shared helpers

from catalog import Case, all_cases
from commands import OUR_COMMAND, count_code_ops, forward_code
from common import write_json

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
REDUCE_COMMAND = Path(PYTHON).with_name("minify-client")  # beside the venv's python, as OUR_COMMAND
# reduce checks its budget between kept changes, not inside a pass, and writes nothing until it ends:
# its process gets this much more than the budget before it is killed
REDUCE_GRACE_S = 120
REDUCED_RUNS = 3  # fresh runs of a reduced script that must all fail (a failure reduce kept on one run may be luck)
# A `kind: hang` case's failure: a run past this many seconds under torch.compile (`reduce --hang`); its
# reduced script is held to it too.
HANG_S = 60.0
_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*)(?:Error|Exception|Exit|Unsupported|Failed)\b.*$")
_OUR_NOTE = re.compile(r"^minify: .*$")
_DIAGNOSIS_NOTE = re.compile(r"diagnos|rerun|holds this failure")  # the diagnosis's own lines, not the capture's
_OBSERVED = re.compile(r"^repro failed with: (?P<text>.*)$", re.MULTILINE)
_EXPECTED = re.compile(r"^minify expected:\s+(?P<text>.*)$", re.MULTILINE)
# reduce's last lines: "reduced X from N to M lines in R runs, S s[ (the budget ran out: ...)]: OUT" and
# "it fails with FAILURE, and passes without torch.compile" (a hang's: "it runs past N s under torch.compile,
# and ends within them without it"); a refusal is "minify-client reduce: WHY"
_REDUCED = re.compile(r"^reduced .* from (?P<before>\d+) to (?P<after>\d+) lines in (?P<runs>\d+) runs, "
                      r"(?P<seconds>[\d.]+) s(?P<unfinished> \(the budget ran out[^)]*\))?: .*$", re.MULTILINE)
_REDUCED_FAILURE = re.compile(r"^it (?:fails with (?P<failure>.*?),? and passes without torch\.compile"
                              r"(?P<export> or torch\.export \(the module run as it is\))?|"
                              r"(?P<hang>runs past \S+ s under torch\.compile), and ends within them without it)$",
                              re.MULTILINE)
_REDUCE_REFUSAL = re.compile(r"^minify-client reduce: (?P<message>.*)$", re.MULTILINE)


@dataclass
class Step:
    """One process of a case: how it ended and the line that says why."""

    command: str
    exit: str = ""  # "0", "1", "SIGSEGV", "timeout after N s"
    seconds: float = 0.0
    error: str = ""  # the last exception line of its output (or the signal)
    log: str = ""  # where its stdout and stderr went

    @property
    def failed(self) -> bool:
        return self.exit != "0"


@dataclass
class Reduction:
    """`minify-client reduce` on the script of a failure nothing captured: what it said, and whether its
    result, run by itself, still fails the script's way (its own runs are its claim, not our check)."""

    status: str = ""  # "reduced" (exit 0), "refused" (exit 2), "timeout", "error"; "" where it did not run
    message: str = ""  # reduced: its "it fails with ..."; refused: its reason; error: the last error line
    lines_before: int | None = None
    lines_after: int | None = None
    runs: int | None = None
    seconds: float | None = None
    finished: bool = True  # False: the budget ran out, the result is the smallest script so far
    reduced_failed: int = 0  # fresh runs of `python REDUCED` that failed with the script's exception type
    reduced_runs: int = 0  # of this many
    reduced_error: str = ""  # how the last of them ended (the last that failed so, if any)
    eager_error: str = ""  # how `TORCHDYNAMO_DISABLE=1 python REDUCED` failed ("" where it passed)
    verified: bool = False  # each run fails with the script's exception type, and it passes without torch.compile
    verdict: str = ""
    # reduce held it to passing with torch.export handing back the module as well (a failure inside export)
    without_export: bool = False


@dataclass
class Ours:
    captured: bool = False
    capture_note: str = ""  # the capture's own "minify: ..." line on the error
    diagnosis: str = ""  # nothing captured: the layer the capture's diagnosis blames, and why
    captures: int = 0
    status: str = ""  # report.json's status, or "timeout"
    reason: str = ""
    signature: str = ""
    ops_original: int | None = None
    ops_final: int | None = None
    repro_observed: str = ""
    repro_expected: str = ""
    verdict: str = ""
    minimal: bool = False
    versions_summary: str = ""  # the version phase's line (report.json), with --torch-envs
    versions: dict[str, str] = field(default_factory=dict)  # torch version -> the repro's outcome there
    reduction: Reduction = field(default_factory=Reduction)  # nothing captured: the script reduced instead


def ours_of(fields: dict) -> Ours:
    """Ours from its --json record (a run from before the reduce step has no `reduction`: not run)."""
    return Ours(**{**fields, "reduction": Reduction(**fields.get("reduction") or {})})


@dataclass
class Torch:
    launcher: bool = False
    queries: int | None = None
    ops_final: int | None = None
    repro_error: str = ""
    verdict: str = ""
    minimal: bool = False


@dataclass
class CaseResult:
    case: str
    issue: str
    kind: str
    feature: str
    original_error: str = ""  # how the script failed under the capture (the user's run)
    script_versions: dict[str, str] = field(default_factory=dict)  # torch version -> how the script ended there
    ours: Ours = field(default_factory=Ours)
    torch: Torch = field(default_factory=Torch)
    steps: dict[str, Step] = field(default_factory=dict)


def run_step(name: str, command: list[str], cwd: Path, log: Path, limit_s: float,
             env: dict[str, str] | None = None) -> Step:
    """Run one process (its own session, so a time limit kills its children too)."""
    step = Step(command=" ".join(command), log=str(log))
    started = time.monotonic()
    with log.open("w") as output:
        process = subprocess.Popen(command, cwd=cwd, stdout=output, stderr=subprocess.STDOUT,
                                   env={**os.environ, **(env or {})}, start_new_session=True)
        try:
            code = process.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = None
    step.seconds = round(time.monotonic() - started, 1)
    return ended(step, code, limit_s, log.read_text(errors="replace"))


def ended(step: Step, code: int | None, limit_s: float, text: str) -> Step:
    """`step` with how its process ended: its exit status (None: stopped at `limit_s`; negative: a
    signal) and the last error line of its output `text`."""
    if code is None:
        step.exit = timeout_exit(limit_s)
        step.error = step.exit
    elif code < 0:
        step.exit = signal.Signals(-code).name
        step.error = f"killed by {step.exit}"
    else:
        step.exit = str(code)
        step.error = last_error_line(text) if code else ""
    return step


def hang_repro_held(step: Step, observed: str) -> bool:
    """Whether a hang's repro.py ran past HANG_S: it stopped itself at its bound (exit 124, "repro
    failed with: TimedOut"), or was stopped here a minute past HANG_S (a repro.py without the watch)."""
    if step.seconds < HANG_S:
        return False
    return step.exit == timeout_exit(HANG_S + 60) or (step.exit == "124" and observed == "TimedOut")


def timeout_exit(limit_s: float) -> str:
    """A step's `exit` when `run_step` stopped it at `limit_s`."""
    return f"timeout after {limit_s:.0f} s"


def last_error_line(text: str) -> str:
    """The last line that names an exception (a traceback's last line), shortened for a table."""
    lines = [line.strip() for line in text.splitlines() if _ERROR_LINE.match(line.strip())]
    return lines[-1][:240] if lines else ""


def capture_env(case: Case, diagnose: bool) -> dict[str, str]:
    """What a user switches on for the failure they saw: the accuracy check where values are wrong, the
    crash-safe capture (docs/client.md) where the process died; and the diagnosis of a failure that
    leaves no capture (it reruns the script only then)."""
    env = {"MINIFY_CAPTURE_DIAGNOSE": "1"} if diagnose else {}
    if case.checks_values:
        env["MINIFY_CAPTURE_ACCURACY"] = "1"
    elif case.kind == "crash":
        env["MINIFY_CAPTURE_CRASH"] = "1"
    elif case.kind == "hang":
        env["MINIFY_CAPTURE_HANG"] = f"{HANG_S:g}"
    return env


def capture_note_of(notes: Sequence[str]) -> str:
    """The capture's own note on the error (why it could not capture), not the diagnosis's lines."""
    own = [note for note in notes if not _DIAGNOSIS_NOTE.search(note)]
    return own[0][:1200] if own else ""


def capture_notes(log: Path) -> list[str]:
    """Our lines ("minify: ...") in a capture step's log."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    return [line.strip() for line in text.splitlines() if _OUR_NOTE.match(line.strip())]


def nothing_captured(note: str, diagnosis: str) -> str:
    """The reason of a failure nothing was captured for: the capture's note, the diagnosis's layer."""
    verdict = f"nothing captured: {note}" if note else "nothing captured" + ("" if diagnosis else " (no note)")
    return verdict + (f"; diagnosed: {diagnosis}" if diagnosis else "")


def diagnosis_of(captures: Path) -> str:
    """The capture's diagnosis of a failure no graph held: the layer to blame and its first sentence."""
    manifest = captures / "diagnoses.json"
    if not manifest.exists():
        return ""
    entries = json.loads(manifest.read_text()).get("diagnoses", [])
    if not entries:
        return ""
    entry = entries[-1]
    # "minify: no graph captured holds this failure (SIGNATURE); it passes with backend 'eager' and
    # fails with 'aot_eager' (...), so AOT autograd is to blame: ...": the layer, and the evidence.
    message = entry.get("message", "")
    found = re.search(r"\bit (passes|fails)\b.*?(?=, so |$)", message)
    evidence = found.group(0) if found else message[:200]
    step = re.search(r"\bNext: [^\n]*", message)
    return f"{entry.get('layer') or 'no layer'} ({evidence})" + (f". {step.group(0)}" if step else "")


def run_ours(case: Case, scratch: Path, result: CaseResult, limits: Limits) -> None:
    ours = result.ours
    captures = scratch / "captures"
    # The diagnosis reruns the script up to four times, each within the capture's own process.
    step = run_step("capture", [PYTHON, "-m", "minify_client.capture", "--dir", str(captures), str(case.path)],
                    REPO, scratch / "capture.log", limits.script_s * (5 if limits.diagnose else 1),
                    capture_env(case, limits.diagnose))
    result.steps["capture"] = step
    result.original_error = step.error
    ours.capture_note = capture_note_of(capture_notes(Path(step.log)))
    manifest = captures / "captures.json"
    entries = json.loads(manifest.read_text())["captures"] if manifest.exists() else []
    ours.captures = len(entries)
    ours.captured = bool(entries)
    if not step.failed:
        ours.verdict = "the script passed under the capture: no failure to minimize"
        return
    if not entries:
        ours.diagnosis = diagnosis_of(captures)
        ours.verdict = nothing_captured(ours.capture_note, ours.diagnosis)
        if limits.reduce_s:
            run_reduce(case, scratch, result, limits)
        return
    entry = entries[0]
    out = scratch / "ours"
    command = [str(OUR_COMMAND), "minify", str(captures / entry["program"]), "--spec", str(captures / entry["spec"]),
               "--inputs", str(captures / entry["inputs"]), "--out", str(out), "--no-culprit",
               "--job-timeout", str(limits.minify_s), "--quiet"]
    if not limits.torch_envs:
        command.append("--no-versions")
    versions_env = {"MINIFY_TORCH_ENVS": ",".join(str(env) for env in limits.torch_envs)} if limits.torch_envs else {}
    # A custom op the script registers: its module is the script, which the worker imports as an
    # operator would allow it (docs/deploy.md, MINIFY_ALLOWED_OP_MODULES), and so does repro.py.
    versions_env |= own_op_module_env(case)
    # The version phase: one repro.py per other torch, after the result (each a fresh interpreter).
    step = run_step("ours", command, REPO, scratch / "ours.log",
                    limits.minify_s + 60 + limits.repro_s * len(limits.torch_envs), versions_env)
    result.steps["ours"] = step
    report_path = out / "report.json"
    if not report_path.exists():
        ours.status = "timeout" if step.exit.startswith("timeout") else "error"
        ours.verdict = f"minify-worker left no report.json ({step.error or step.exit})"
        return
    report = json.loads(report_path.read_text())
    ours.status = report["status"]
    ours.reason = report.get("reason") or ""
    ours.signature = report.get("signature") or ""
    ours.ops_original = report.get("nodes_original")
    ours.ops_final = report.get("nodes_final")
    ours.versions_summary = report.get("versions_summary") or ""
    ours.versions = {run["torch"]: run["outcome"] for run in report.get("versions") or []}
    if ours.status != "succeeded":
        ours.verdict = f"{ours.status}: {ours.reason}"[:300]
        return
    # A hang's repro.py must still be running at HANG_S, as the script was: it stops itself at the
    # bound the job saw the result hang past (exit 124 and "repro failed with: TimedOut"), and a
    # repro.py without that watch is stopped here a minute later.
    hang = case.kind == "hang"
    step = run_step("ours_repro", [PYTHON, "repro.py"], out, scratch / "ours_repro.log",
                    HANG_S + 60 if hang else limits.repro_s, own_op_module_env(case))
    result.steps["ours_repro"] = step
    repro_text = Path(step.log).read_text(errors="replace")
    observed, expected = _OBSERVED.search(repro_text), _EXPECTED.search(repro_text)
    ours.repro_observed = observed["text"].strip() if observed else step.error
    ours.repro_expected = expected["text"].strip() if expected else ours.signature
    if hang:
        ours.minimal = hang_repro_held(step, ours.repro_observed)
        ours.verdict = (f"minimal repro: {ours.ops_original} -> {ours.ops_final} ops (repro.py runs past {HANG_S:g} s)"
                        if ours.minimal else f"repro.py ends after {step.seconds:.0f} s ({step.exit}): no hang past "
                        f"{HANG_S:g} s")
    elif not step.failed:
        ours.verdict = "repro.py passes"
    elif step.exit.startswith("SIG") and step.exit not in ours.signature:
        ours.verdict = f"repro.py dies by {step.exit}, the signature is {ours.signature}"
    elif not step.exit.startswith("SIG") and ours.repro_observed != ours.repro_expected:
        ours.verdict = f"repro.py fails with {ours.repro_observed!r}, not {ours.repro_expected!r}"
    else:
        ours.minimal = True
        ours.verdict = f"minimal repro: {ours.ops_original} -> {ours.ops_final} ops"


def run_reduce(case: Case, scratch: Path, result: CaseResult, limits: Limits) -> None:
    """What a user runs after the capture's diagnosis says no graph holds the failure: `minify-client
    reduce` on the script. On a copy in the case's folder (reduce writes its candidates beside the
    script), with an inductor cache of its own (the run's holds the capture's graphs of this script),
    and its result then run by itself, compiled and not, in fresh processes of our own."""
    reduction = result.ours.reduction
    folder = scratch / "reduce"
    folder.mkdir()
    script = folder / case.path.name
    shutil.copyfile(case.path, script)
    out = folder / f"{case.name}.min.py"
    hang = ["--hang", f"{HANG_S:g}"] if case.kind == "hang" else []
    step = run_step("reduce", [str(REDUCE_COMMAND), "reduce", str(script), "--out", str(out),
                               "--budget", f"{limits.reduce_s:g}", *hang],
                    folder, scratch / "reduce.log", limits.reduce_s + REDUCE_GRACE_S,
                    {"TORCHINDUCTOR_CACHE_DIR": str(scratch / "reduce-inductor-cache")})
    result.steps["reduce"] = step
    read_reduce_log(reduction, step, Path(step.log).read_text(errors="replace"))
    if reduction.status == "reduced" and not out.exists():
        reduction.status, reduction.message = "error", f"exit 0 but no {out.name} written"
    if reduction.status != "reduced":
        reduction.verdict = reduce_failure_verdict(reduction, step, limits.reduce_s)
        return
    check_reduced(out, scratch, result, limits, hang=bool(hang))


def check_reduced(out: Path, scratch: Path, result: CaseResult, limits: Limits, *, hang: bool = False) -> None:
    """The reduced script, run by itself: it must fail with the script's exception type each of
    REDUCED_RUNS times, and pass without torch.compile. Each run gets an empty inductor cache: reduce's
    candidates share one, and a graph an earlier candidate compiled can be what makes a later one
    fail (#139789's reduction failed only on a cached graph compiled for other inputs); and more than
    one run, because reduce keeps a candidate on one run and may delete its `torch.manual_seed`. With
    `hang`, each run must run past `HANG_S` (it is stopped there)."""
    reduction = result.ours.reduction
    limit_s = HANG_S if hang else limits.script_s
    expected = timeout_exit(HANG_S) if hang else failure_kind(result.steps["capture"])
    runs = []
    for number in range(1, REDUCED_RUNS + 1):
        step = run_step(f"reduced_{number}", [PYTHON, out.name], out.parent, scratch / f"reduced-{number}.log",
                        limit_s, {"TORCHINDUCTOR_CACHE_DIR": str(scratch / f"reduced-cache-{number}")})
        result.steps[f"reduced_{number}"] = step
        runs.append(step)
    # A failure inside torch.export passes once export hands back the module as it is (rerun.py does so).
    reference = ([PYTHON, "-m", "minify_client.capture.rerun", out.name] if reduction.without_export
                 else [PYTHON, out.name])
    without = {"MINIFY_RERUN_EAGER_EXPORT": "1"} if reduction.without_export else {}
    eager = run_step("reduced_eager", reference, out.parent, scratch / "reduced-eager.log", limits.script_s,
                     {"TORCHDYNAMO_DISABLE": "1", "TORCHINDUCTOR_CACHE_DIR": str(scratch / "reduced-cache-eager"),
                      **without})
    disabled = "TORCHDYNAMO_DISABLE=1" + (" and torch.export run eagerly" if without else "")
    result.steps["reduced_eager"] = eager
    same = [step for step in runs if step.failed and expected and failure_kind(step) == expected]
    other = [step for step in runs if step not in same]
    reduction.reduced_failed, reduction.reduced_runs = len(same), len(runs)
    reduction.reduced_error = (same or other)[-1].error
    reduction.eager_error = eager.error if eager.failed else ""
    reduced = (f"script {reduction.lines_before} → {reduction.lines_after} lines in {reduction.runs} runs, "
               f"{reduction.seconds:.0f} s" + ("" if reduction.finished else " (the budget ran out: its smallest)"))
    if other:
        ended = "; ".join(dict.fromkeys(f"fails with {step.error!r}" if step.failed else "passes" for step in other))
        reduction.verdict = (f"{reduced}, but `python {out.name}` fails with {expected or '?'} in {len(same)} of "
                             f"{len(runs)} fresh runs (else: {ended})")
    elif eager.failed:
        reduction.verdict = f"{reduced}, but it fails with {disabled} too ({eager.error or eager.exit})"
    else:
        reduction.verified = True
        reduction.verdict = (f"{reduced}; `python {out.name}` fails with {expected} in each of {len(runs)} fresh "
                             f"runs, and passes with {disabled}")


def read_reduce_log(reduction: Reduction, step: Step, text: str) -> None:
    """How reduce ended, from its exit and its last lines (they are its whole report: it writes no JSON)."""
    if step.exit.startswith("timeout"):
        reduction.status = "timeout"
    elif step.exit == "0":
        reduction.status = "reduced"
    elif step.exit == "2":  # the script passes, or fails without torch.compile too (or a usage error)
        reduction.status = "refused"
    else:
        reduction.status = "error"
    refusal = _REDUCE_REFUSAL.findall(text)
    reduction.message = refusal[-1][:600] if refusal else step.error
    summary, failure = _REDUCED.search(text), _REDUCED_FAILURE.search(text)
    if reduction.status == "reduced" and summary is None:
        reduction.status, reduction.message = "error", "exit 0 without its 'reduced ... lines' line"
    if summary:
        reduction.lines_before, reduction.lines_after = int(summary["before"]), int(summary["after"])
        reduction.runs, reduction.seconds = int(summary["runs"]), float(summary["seconds"])
        reduction.finished = summary["unfinished"] is None
        reduction.message = (failure["failure"] or failure["hang"])[:600] if failure else ""
        reduction.without_export = bool(failure and failure["export"])


def reduce_failure_verdict(reduction: Reduction, step: Step, budget_s: float) -> str:
    """Why reduce left no script to check."""
    if reduction.status == "refused":
        return f"refused: {reduction.message or step.error}"
    if reduction.status == "timeout":
        return f"killed after {step.seconds:.0f} s (its budget {budget_s:g} s): no script written"
    return f"error (exit {step.exit}): {reduction.message or step.error or 'no error line'}"


def failure_kind(step: Step) -> str:
    """The exception type a failed step raised (its last error line, up to the colon), or its signal."""
    if step.exit.startswith("SIG") or step.exit.startswith("timeout"):
        return step.exit
    return step.error.split(":", 1)[0].strip()


def interpreter(env: Path) -> Path:
    """A venv folder's python, or the interpreter itself."""
    return env / "bin" / "python" if env.is_dir() else env


def env_torch_version(python: Path) -> str:
    probe = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"], capture_output=True,
                           text=True)
    return probe.stdout.strip() or f"unknown ({python})"


def run_script_versions(case: Case, scratch: Path, result: CaseResult, limits: Limits) -> None:
    """The case's own script under each torch (this one first): where does the issue's bug show?"""
    for python in [Path(PYTHON), *(interpreter(env) for env in limits.torch_envs)]:
        version = env_torch_version(python)
        step = run_step(f"script_{version}", [str(python), str(case.path)], scratch,
                        scratch / f"script-{version}.log", limits.script_s)
        result.steps[f"script_{version}"] = step
        result.script_versions[version] = f"fails ({step.error})" if step.failed else "passes"


def own_op_module_env(case: Case) -> dict[str, str]:
    """The script's folder on the path, and its module allowed for the custom ops it registers."""
    path = os.pathsep.join(filter(None, [str(case.path.parent), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, "MINIFY_ALLOWED_OP_MODULES": case.path.stem}


def torch_env(case: Case) -> dict[str, str]:
    level = {"crash": "3"}.get(case.kind, "4" if case.checks_values else "2")
    return {"TORCHDYNAMO_REPRO_AFTER": "aot", "TORCHDYNAMO_REPRO_LEVEL": level}


def run_torch(case: Case, scratch: Path, result: CaseResult, limits: Limits) -> None:
    side = result.torch
    work = scratch / "torch"
    work.mkdir()
    step = run_step("torch_dump", [PYTHON, str(case.path)], work, scratch / "torch_dump.log", limits.script_s,
                    torch_env(case))
    result.steps["torch_dump"] = step
    launchers = sorted(work.glob("**/minifier_launcher.py"))
    side.launcher = bool(launchers)
    if not launchers:
        side.verdict = f"no minifier_launcher.py written (the script ended: {step.error or 'passed'})"
        return
    # In-process checks (`--no-isolate`), except for a crash, which would kill the minifier: torch's
    # default isolates every check in a fresh Python, which this bench cannot afford per case.
    isolation = "--isolate" if case.kind == "crash" else "--no-isolate"
    step = run_step("torch_minify", [PYTHON, str(launchers[-1]), "minify", isolation], work,
                    scratch / "torch_minify.log", limits.minify_s)
    result.steps["torch_minify"] = step
    queries = re.search(r"^Made (\d+) queries", Path(step.log).read_text(errors="replace"), re.MULTILINE)
    side.queries = int(queries[1]) if queries else None
    repro = work / "repro.py"
    if not repro.exists() or side.queries is None:
        side.verdict = f"the minifier did not finish ({step.error or step.exit}): no repro.py"
        return
    code = forward_code(repro.read_text())
    side.ops_final = count_code_ops(code) if code else None
    step = run_step("torch_repro", [PYTHON, str(repro)], work, scratch / "torch_repro.log", limits.repro_s)
    result.steps["torch_repro"] = step
    side.repro_error = step.error
    if not step.failed:
        side.verdict = "its repro.py passes"
    else:
        side.minimal = True
        side.verdict = f"repro fails ({step.error[:120]}): {side.ops_final} ops"


@dataclass
class Limits:
    script_s: float  # a script run (the capture's, torch's dump)
    minify_s: float  # one minifier run (ours' job timeout; torch's launcher)
    repro_s: float  # a repro.py run
    diagnose: bool = True  # MINIFY_CAPTURE_DIAGNOSE on the capture: a failure nothing captured, rerun to blame a layer
    torch_envs: tuple[Path, ...] = ()  # other torch installations: the script under each, and our version phase
    reduce_s: float = 0  # minify-client reduce's --budget where nothing is captured; 0: no reduce


def run_case(case: Case, work: Path, sides: Sequence[str], limits: Limits) -> CaseResult:
    scratch = work / case.name
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    result = CaseResult(case=case.name, issue=case.issue, kind=case.kind, feature=case.feature)
    if "scripts" in sides and limits.torch_envs:
        run_script_versions(case, scratch, result, limits)
    if "ours" in sides:
        run_ours(case, scratch, result, limits)
    if "torch" in sides:
        run_torch(case, scratch, result, limits)
    return result


def load_results(paths: Sequence[Path]) -> tuple[list[str], list[CaseResult]]:
    """Earlier runs' cases, in corpus order (later files win), with the no-capture reasons re-derived."""
    revisions: list[str] = []
    by_case: dict[str, CaseResult] = {}
    for path in paths:
        data = json.loads(path.read_text())
        revisions.append(data["revision"])
        for item in data["results"]:
            steps = {name: Step(**step) for name, step in item.pop("steps").items()}
            ours, side = ours_of(item.pop("ours")), Torch(**item.pop("torch"))
            if ours.verdict.startswith("nothing captured"):
                log = Path(steps["capture"].log)  # the whole note where the log is still there
                ours.capture_note = capture_note_of(capture_notes(log) if log.is_file() else [ours.capture_note])
                captures = log.parent / "captures"
                ours.diagnosis = diagnosis_of(captures) if captures.is_dir() else ours.diagnosis
                ours.verdict = nothing_captured(ours.capture_note, ours.diagnosis)
            earlier = by_case.get(item["case"])
            if earlier is not None:  # a side this run did not run is the earlier run's
                side = side if side.verdict else earlier.torch
                ours = ours if ours.verdict else earlier.ours
                item["script_versions"] = item.get("script_versions") or earlier.script_versions
                steps = {**earlier.steps, **steps}
            by_case[item["case"]] = CaseResult(**item, ours=ours, torch=side, steps=steps)
    order = [case.name for case in all_cases()]
    return list(dict.fromkeys(revisions)), sorted(by_case.values(), key=lambda result: (
        order.index(result.case) if result.case in order else len(order)))


def torch_results(path: Path) -> dict[str, Torch]:
    """Torch's side of every case of an earlier run's --json where that run ran it."""
    data = json.loads(path.read_text())
    return {item["case"]: Torch(**item["torch"]) for item in data["results"] if item["torch"]["verdict"]}


def markdown(results: Sequence[CaseResult], revision: str) -> str:
    """The table and the list of cases that did not end in a minimal repro, with their reasons."""
    ours_ok = sum(result.ours.minimal for result in results)
    reduced = sum(result.ours.reduction.verified for result in results)
    torch_ok = sum(result.torch.minimal for result in results)
    lines = [
        f"At `{revision}`, torch {torch_version()}, {len(results)} cases: **ours {ours_ok} minimal repros "
        f"with the same signature, torch's minifier {torch_ok} reproducing repros.**"
        + (f" Where nothing was captured, {reduced} scripts reduced by `minify-client reduce` (✂️: a smaller "
           "script that still fails, not a minimal graph)." if reduced else ""),
        "",
        "| case | kind | captured | ours: ops | ours | torch: ops | torch |",
        "|---|---|---|---|---|---|---|",
    ]
    for result in results:
        ours, side = result.ours, result.torch
        ops = f"{ours.ops_original} → {ours.ops_final}" if ours.minimal else "-"
        lines.append(f"| [{result.case}]({result.issue}) | {result.kind} | {'yes' if ours.captured else 'no'} | "
                     f"{ops} | {ours_mark(ours)} | "
                     f"{side.ops_final if side.minimal else '-'} | {'✅' if side.minimal else '❌'} |")
    with_versions = [result for result in results if result.script_versions]
    if with_versions:
        lines += ["", "Which torch versions have the bug: the case's own script under each, and our version phase "
                  "(the minimal repro under each):", "",
                  "| case | the script fails on | passes on | ours: version phase |", "|---|---|---|---|"]
        for result in with_versions:
            failing = [version for version, ended in result.script_versions.items() if ended.startswith("fails")]
            passing = [version for version, ended in result.script_versions.items() if ended == "passes"]
            lines.append(f"| {result.case} | {', '.join(failing) or '-'} | {', '.join(passing) or '-'} | "
                         f"{_cell(result.ours.versions_summary) or '-'} |")
    lines += ["", "Not a minimal repro (ours), and why:", ""]
    lines += [f"- `{result.case}` ({result.kind}): {_cell(ours_reason(result.ours))}"
              for result in results if not result.ours.minimal]
    lines += ["", "Torch's minifier, where it did not end in a reproducing repro:", ""]
    lines += [f"- `{result.case}`: {_cell(result.torch.verdict)}" for result in results if not result.torch.minimal]
    return "\n".join(lines) + "\n"


def ours_mark(ours: Ours) -> str:
    """The ours cell: ✅ a minimal graph repro; ✂️ a reduced script that was checked to fail (nothing
    captured: a smaller program, not a minimal graph, so it never counts as ✅); else ❌."""
    if ours.minimal:
        return "✅"
    if ours.reduction.verified:
        return f"✂️ script {ours.reduction.lines_before} → {ours.reduction.lines_after} lines"
    return "❌"


def ours_reason(ours: Ours) -> str:
    """Why ours is not a minimal repro, and what reduce made of the script where it ran."""
    return ours.verdict + (f"; reduce: {ours.reduction.verdict}" if ours.reduction.status else "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def torch_version() -> str:
    probe = subprocess.run([PYTHON, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    return probe.stdout.strip() or "unknown"


def git_revision() -> str:
    """HEAD, and how many tracked files the working tree changes (others' work in progress runs too)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                             capture_output=True, text=True).stdout.splitlines()
    revision = head.stdout.strip() or "unknown"
    return f"{revision} + {len(changed)} uncommitted files" if changed else revision


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="*", default=[], help="case names or prefixes (pt_175966); default all")
    parser.add_argument("--sides", nargs="+", choices=("ours", "torch", "scripts"), default=["ours", "torch"],
                        help="ours, torch's minifier, and (with --torch-envs) the script under each torch")
    parser.add_argument("--work", type=Path, default=REPO / "out" / "realbugs")
    parser.add_argument("--json", type=Path, help="every case's full record (rewritten after each case)")
    parser.add_argument("--markdown", type=Path, help="the table (written at the end)")
    parser.add_argument("--script-limit", type=float, default=180, help="seconds for one run of a script")
    parser.add_argument("--minify-limit", type=float, default=240, help="seconds for one minifier run")
    parser.add_argument("--repro-limit", type=float, default=120, help="seconds for one repro.py run")
    parser.add_argument("--reduce-limit", type=float, default=300,
                        help=f"minify-client reduce's --budget where nothing is captured (its process: "
                             f"{REDUCE_GRACE_S} s more)")
    parser.add_argument("--no-reduce", dest="reduce", action="store_false",
                        help="no minify-client reduce where nothing is captured (the reason alone)")
    parser.add_argument("--jobs", type=int, default=1, help="cases run at once (each step is CPU-bound)")
    parser.add_argument("--render", type=Path, nargs="+", metavar="JSON",
                        help="run nothing: print (and --markdown) the table of earlier runs' --json, later files "
                             "winning for a case they share")
    parser.add_argument("--no-diagnose", dest="diagnose", action="store_false",
                        help="no MINIFY_CAPTURE_DIAGNOSE (it reruns a script that failed with nothing captured)")
    parser.add_argument("--torch-from", type=Path, nargs="+", metavar="JSON",
                        help="take torch's side from earlier runs' --json instead of running it again (torch's "
                             "minifier does not change with this repository's commits; ours is run); a case none "
                             "of them holds is run on both sides")
    parser.add_argument("--torch-envs", type=Path, nargs="+", default=[], metavar="VENV",
                        help="other torch installations (venv folders or interpreters): the script runs under each, "
                             "and ours runs its version phase over them (MINIFY_TORCH_ENVS)")
    options = parser.parse_args(argv)

    if options.render:
        revisions, rendered = load_results(options.render)
        table = markdown(rendered, ", ".join(revisions))
        if options.markdown:
            options.markdown.write_text(table)
        print(table)
        return 0
    cases = [case for case in all_cases()
             if not options.cases or any(case.name.startswith(prefix) for prefix in options.cases)]
    if not cases:
        parser.error(f"no case matches {options.cases}")
    limits = Limits(options.script_limit, options.minify_limit, options.repro_limit, options.diagnose,
                    tuple(path.resolve() for path in options.torch_envs),
                    options.reduce_limit if options.reduce else 0)
    work = options.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(work / "inductor-cache"))
    os.environ.setdefault("MINIFY_CACHE_DIR", str(work / "minify-cache"))
    revision = git_revision()
    earlier: dict[str, Torch] = {}
    for path in options.torch_from or []:
        earlier.update(torch_results(path))
    finished: dict[str, CaseResult] = {}

    def one(case: Case) -> CaseResult:
        started = time.monotonic()
        sides = [side for side in options.sides if not (side == "torch" and case.name in earlier)]
        result = run_case(case, work, sides, limits)
        if case.name in earlier:
            result.torch = earlier[case.name]
        print(f"{case.name}: ours: {ours_reason(result.ours)} | torch: {result.torch.verdict} "
              f"({time.monotonic() - started:.0f} s)", flush=True)
        return result

    with concurrent.futures.ThreadPoolExecutor(max_workers=options.jobs) as pool:
        for result in pool.map(one, cases):
            finished[result.case] = result
            if options.json:
                write_json(options.json, {"revision": revision,
                                          "results": [asdict(item) for item in finished.values()]})
    results = [finished[case.name] for case in cases]
    table = markdown(results, revision)
    if options.markdown:
        options.markdown.write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
