"""Corpus benchmark: real architectures failing inductor's relu bug, each the user's way, against torch's minifier.

    .venv/bin/python bench/corpus.py --out out/corpus [--cases REGEX] [--modes inference,dynamic,training,accuracy]
                                     [--jobs N] [--no-torch] [--resume] [--torch-limit S] [--job-limit S]
    .venv/bin/python bench/corpus.py --check [--cases REGEX]     # each model builds, runs eagerly, has a relu

The cases are bench/corpus_cases.py's architectures (transformers models at tiny sizes, two
hand-built vision nets) in each mode (inference, `dynamic=True`, a training step, and a
wrong-values subset). Per mode, the user's way:

1. capture: a generated pytest file (one test per architecture) runs under minify's pytest plugin
   (`MINIFY_CAPTURE_DIR`, and `MINIFY_CAPTURE_ACCURACY=1` for the wrong values): one pytest process
   per mode; the plugin writes a .pt2, spec.json and inputs.pt per failing graph;
2. minimize: one `minify-server` (embedded Redis, `--jobs` workers) on a free port; every capture
   is submitted as `minify-client submit X.pt2 --spec SPEC --inputs inputs.pt --wait --out DIR
   --json`, the spec being the capture's own with `culprit: false` (the culprit phase runs after
   the repro is delivered and is not measured here: off, to save time);
3. check: `python repro.py` in the downloaded artifacts; its "repro failed with:" line against
   report.json's signature; the minimal graph's ops (the relu alone?) and, for `dynamic`, the dynamic
   dims of the captured program, of minimized.pt2 and repro.py's DYNAMIC_DIMS;
4. torch's side: the same generated tests under `TORCHDYNAMO_REPRO_AFTER=aot` (repro level 4 for
   the wrong values), which writes torch's `minifier_launcher.py` for the failing graph; then
   `python minifier_launcher.py minify --no-isolate` (`--torch-isolate`: its default, a fresh Python per
   check) under `--torch-limit`; its result is the `repro.py` it leaves, whose ops are counted and
   which is run to see whether it still fails with the capture's signature (drifted: it does not).

Writes OUT/results.json (every case's record, rewritten after each step, so `--resume` skips the
cases already done) and OUT/results.md (the table, the summary, the reason of every case that did
not end in a minimal repro). See docs/bench.md, "Corpus".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from commands import count_code_ops, forward_code
from common import write_json
from corpus_cases import (
    BUGGY_OPS,
    BY_NAME,
    DEFAULT_MODES,
    MODES,
    SIGNATURE_BY_BUG,
    STRUCTURAL_OPS,
    Case,
    all_cases,
    same_signature,
)
from run import export_revision, markdown_table

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
CLIENT = Path(sys.executable).with_name("minify-client")
TEST_TIMEOUT_S = 300  # one generated test (build, compile, capture): pytest-timeout fails it past this
REPRO_TIMEOUT_S = 300
_REPRO_FAILED = re.compile(r"^repro failed with: (?P<signature>.*)$", re.MULTILINE)
_TORCH_OP = re.compile(r"torch\.ops\.(?:aten|prims)\.(?P<op>\w+)\.|\boperator\.(?P<py>getitem)\b")
_SIGNATURE_LINE = re.compile(r"^SIGNATURE: (?P<signature>.*)$", re.MULTILINE)
# Runs a script as __main__ and prints the signature of what it raised, in the form minify records it.
_SIGNATURE_RUNNER = """
import runpy, sys
from minify_contract.signatures import signature_line
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except BaseException as error:
    name = type(error).__name__
    print("SIGNATURE: " + (name if name == "AccuracyError" else signature_line(error)), flush=True)
    sys.exit(1)
print("SIGNATURE: none (it passed)")
"""


# --- records ------------------------------------------------------------------------------------


class Results:
    """OUT/results.json: one record per case, by name; written after every change."""

    def __init__(self, path: Path, resume: bool, meta: dict[str, Any]) -> None:
        self.path = path
        self.meta = meta
        self.cases: dict[str, dict[str, Any]] = {}
        if resume and path.exists():
            self.cases = json.loads(path.read_text()).get("cases", {})

    def record(self, case: Case) -> dict[str, Any]:
        architecture = BY_NAME[case.architecture]
        return self.cases.setdefault(case.name, {
            "case": case.name, "architecture": case.architecture, "family": architecture.family,
            "mode": case.mode, "bug": case.bug, "relu_setting": architecture.relu,
        })

    def save(self) -> None:
        write_json(self.path, {**self.meta, "updated": time.strftime("%Y-%m-%d %H:%M:%S"), "cases": self.cases})


def needs_ours(record: dict[str, Any] | None) -> bool:
    """Our side has yet to run: no verdict, or one the harness caused (a test pytest never ran, a job
    without a report: the client could not reach the service, or gave up waiting)."""
    if record is None or "verdict" not in record:
        return True
    return (record.get("capture", {}).get("test_outcome") == "not run"
            or record.get("ours", {}).get("status") in ("error", "timeout"))


def needs_torch(record: dict[str, Any] | None) -> bool:
    return record is None or "torch" not in record


def merge_torch_side(results: Results, source: Path) -> None:
    """Torch's side of each case from another run's results (a `--no-ours` run beside this one)."""
    for name, record in json.loads(source.read_text()).get("cases", {}).items():
        if "torch" in record:
            merged = results.cases.setdefault(name, {key: value for key, value in record.items()
                                                     if key not in ("torch", "ours", "capture", "verdict")})
            merged["torch"] = record["torch"]
    results.save()


# --- running children ----------------------------------------------------------------------------


def run_logged(command: Sequence[str], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None,
               timeout_s: float | None = None) -> tuple[int | None, float, str]:
    """Run `command` with its output in `log`; kill its whole process group past `timeout_s`.
    Returns (exit code or None on timeout, seconds, the output)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log, "wb") as output:
        child = subprocess.Popen(list(command), stdout=output, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                 start_new_session=True)
        try:
            returncode: int | None = child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            returncode = None
    return returncode, time.monotonic() - started, log.read_text(errors="replace")


# Where minify's packages come from (`--ours-rev`): a checkout of a revision first on PYTHONPATH, or
# None for the working tree (the editable install).
OURS_SOURCE: Path | None = None


def bench_env(**extra: str) -> dict[str, str]:
    """The environment of every child: minify's packages of `--ours-rev`, bench/ importable
    (corpus_cases, corpus_models, zoo), no capture unless asked, no dynamo repro unless asked."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("MINIFY_CAPTURE", "TORCHDYNAMO_REPRO"))}
    paths = [str(OURS_SOURCE)] if OURS_SOURCE else []
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*paths, str(BENCH_DIR), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def checkout(revision: str, out: Path) -> Path:
    """`revision`'s client, worker and server (and the pytest plugin's entry module) in OUT/src-REV:
    run.py's `export_revision`, plus what the service and the plugin need beside it."""
    target = export_revision(revision, out)
    commit = target.name.removeprefix("src-")
    for path in ("server/minify_server", "client/_minify_pytestplugin.py"):
        link = target / Path(path).name
        if not link.exists():
            archive = subprocess.run(["git", "archive", commit, path], cwd=REPO, capture_output=True,
                                     check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
            link.symlink_to(target / path)
    return target


def say(line: str) -> None:
    """A progress line, with the time of day (a long run is followed in its log)."""
    print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)


def tail(text: str, lines: int = 3, width: int = 400) -> str:
    """The last meaningful lines of a log, for a reason in the table."""
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(kept[-lines:])[-width:]


# --- 1. capture -----------------------------------------------------------------------------------

TEST_FILE = '''"""Generated by bench/corpus.py: the corpus's {mode} cases, one test per architecture."""

import pytest

import corpus_models


@pytest.mark.parametrize("architecture", {architectures!r})
def test_{mode}(architecture: str) -> None:
    corpus_models.run_case(architecture, "{mode}")
'''
PYTEST_INI = "[pytest]\naddopts = -p no:cacheprovider\n"


def write_tests(directory: Path, mode: str, cases: Sequence[Case]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "pytest.ini").write_text(PYTEST_INI)
    path = directory / f"test_{mode}.py"
    path.write_text(TEST_FILE.format(mode=mode, architectures=[case.architecture for case in cases]))
    return path


def run_tests(test_file: Path, cases: Sequence[Case], env: dict[str, str], log: Path) -> dict[str, dict[str, Any]]:
    """One pytest run over the generated file; per architecture: outcome, seconds, message.

    Its tests run in one pytest-xdist worker (`-n 1`): a test that crashes the process (a segfault
    in a compiled kernel) fails alone, the worker is replaced, and the run goes on to the others.
    """
    junit = log.with_suffix(".xml")
    command = [sys.executable, "-m", "pytest", str(test_file), "-c", str(test_file.parent / "pytest.ini"),
               "-q", "-p", "no:randomly", "-n", "1", "--max-worker-restart", str(len(cases)),
               f"--timeout={TEST_TIMEOUT_S}", f"--junitxml={junit}"]
    returncode, seconds, output = run_logged(command, log, env=env, cwd=test_file.parent,
                                             timeout_s=TEST_TIMEOUT_S * (len(cases) + 1))
    outcomes = parse_junit(junit) if junit.exists() else {}
    for case in cases:
        outcomes.setdefault(case.architecture, {
            "outcome": "not run", "seconds": None,
            "message": f"pytest ended (exit {returncode}, {seconds:.0f} s) before this test ran: {tail(output)}"})
    return outcomes


def parse_junit(path: Path) -> dict[str, dict[str, Any]]:
    """junit XML's testcases by their parameter (the architecture)."""
    outcomes: dict[str, dict[str, Any]] = {}
    for testcase in ElementTree.parse(path).getroot().iter("testcase"):
        match = re.search(r"\[(?P<param>[^\]]+)\]$", testcase.get("name", ""))
        if not match:
            continue
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            element = testcase.find(kind)
            if element is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind]
                message = element.get("message") or (element.text or "")
                break
        outcomes[match["param"]] = {"outcome": outcome, "seconds": float(testcase.get("time") or 0),
                                    "message": message.strip()[:2000]}
    return outcomes


def captures_by_architecture(capture_dir: Path, mode: str) -> dict[str, list[dict[str, Any]]]:
    """captures.json's entries per architecture, from the test ids that hit them (`test_MODE[arch]`)."""
    manifest = capture_dir / "captures.json"
    found: dict[str, list[dict[str, Any]]] = {}
    if not manifest.exists():
        return found
    for entry in json.loads(manifest.read_text()).get("captures", []):
        for test in entry.get("tests", []):
            match = re.search(rf"test_{mode}\[(?P<param>[^\]]+)\]", test)
            if match:
                found.setdefault(match["param"], []).append(entry)
    return found


def capture(mode: str, cases: Sequence[Case], out: Path, results: Results) -> None:
    """Step 1 for one mode: the generated tests under the capture plugin; each case's capture record."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    capture_dir = out / "captures" / f"{mode}-{stamp}"
    test_file = write_tests(out / "tests" / f"{mode}-{stamp}", mode, cases)
    env = bench_env(MINIFY_CAPTURE_DIR=str(capture_dir))
    if mode == "accuracy":
        env["MINIFY_CAPTURE_ACCURACY"] = "1"
    say(f"[{mode}] capturing {len(cases)} cases: {test_file}")
    outcomes = run_tests(test_file, cases, env, out / "logs" / f"capture-{mode}-{stamp}.log")
    by_architecture = captures_by_architecture(capture_dir, mode)
    for case in cases:
        record = results.record(case)
        test = outcomes[case.architecture]
        entries = by_architecture.get(case.architecture, [])
        record["capture"] = {
            "test_outcome": test["outcome"], "seconds": test["seconds"], "captured": bool(entries),
            "graphs": len(entries), "directory": str(capture_dir),
            "entries": [{key: entry.get(key) for key in ("name", "level", "kind", "signature", "program", "spec",
                                                        "inputs")} for entry in entries],
            "test_message": test["message"][:1000],
        }
        say(f"[{mode}] {case.name}: test {test['outcome']}, {len(entries)} capture(s)")
    results.save()


# --- 2. minimize, 3. check ----------------------------------------------------------------------


def job_spec(capture_dir: Path, entry: dict[str, Any], destination: Path, job_limit_s: float) -> Path:
    """The capture's own spec, with the culprit phase off and the job bounded."""
    spec = json.loads((capture_dir / entry["spec"]).read_text())
    spec["culprit"] = False
    spec.setdefault("limits", {})["job_timeout_s"] = job_limit_s
    destination.parent.mkdir(parents=True, exist_ok=True)
    destination.write_text(json.dumps(spec, indent=2))
    return destination


def minimize(case: Case, record: dict[str, Any], server: str, out: Path, job_limit_s: float) -> None:
    """Step 2 and 3 for one captured case: submit, wait, download, run repro.py."""
    capture_dir = Path(record["capture"]["directory"])
    entry = record["capture"]["entries"][0]
    case_dir = out / "jobs" / case.name
    artifacts = case_dir / "artifacts"
    shutil.rmtree(artifacts, ignore_errors=True)  # a run resumed: no report of an earlier attempt
    spec = job_spec(capture_dir, entry, case_dir / "spec.json", job_limit_s)
    command = [str(CLIENT), "submit", "--server", server, str(capture_dir / entry["program"]), "--spec", str(spec),
               "--inputs", str(capture_dir / entry["inputs"]), "--wait", "--no-wait-culprit", "--json",
               "--out", str(artifacts), "--force"]
    returncode, seconds, _ = run_logged(command, case_dir / "submit.log", env=bench_env(),
                                        timeout_s=job_limit_s + 120)
    ours: dict[str, Any] = {"exit": returncode, "minimize_s": round(seconds, 1),
                            "source": str(OURS_SOURCE or "working tree")}
    record["ours"] = ours
    report_path = artifacts / "report.json"
    if returncode is None:
        ours.update(status="timeout", reason=f"the client still waited after {job_limit_s + 120:.0f} s")
        return
    if not report_path.exists():
        ours.update(status="error", reason=f"no report.json (client exit {returncode}): "
                                           f"{tail((case_dir / 'submit.log').read_text(errors='replace'))}")
        return
    report = json.loads(report_path.read_text())
    ours.update(status=report["status"], reason=report.get("reason"), signature=report.get("signature"),
                nodes_original=report.get("nodes_original"), nodes_final=report.get("nodes_final"),
                checks=report.get("checks_total"), elapsed_s=report.get("elapsed_s"),
                artifacts=str(artifacts), artifact_errors=report.get("artifact_errors") or {})
    if report["status"] != "succeeded":
        return
    ours["ops"] = code_ops(report.get("graph_code") or "")
    repro = artifacts / "repro.py"
    if repro.exists():
        code, repro_s, output = run_logged([sys.executable, str(repro)], case_dir / "repro.log", env=bench_env(),
                                           cwd=artifacts, timeout_s=REPRO_TIMEOUT_S)
        failed = _REPRO_FAILED.search(output)
        ours["repro"] = {"exit": code, "seconds": round(repro_s, 1),
                         "signature": failed["signature"].strip() if failed else None,
                         "reproduces": bool(failed) and code not in (0, None)
                         and same_signature(failed["signature"].strip(), report.get("signature")),
                         "output": None if failed else tail(output)}
        dims = re.search(r"^DYNAMIC_DIMS = \[(?P<body>.*?)^\]", repro.read_text(), re.MULTILINE | re.DOTALL)
        ours["repro_dynamic_dims"] = bool(dims and dims["body"].strip().strip(",").strip("{}, \n"))


def dead_ops(code: str) -> list[str]:
    """The ops of a graph's printed code whose results nothing reads (FX's `x = None` cleanups aside)."""
    statements = [line.strip().split(";")[0] for line in code.splitlines()[1:] if line.strip()]
    dead = []
    for index, statement in enumerate(statements):
        assignment = re.match(r"(?P<name>\w+) = (?P<call>.*)$", statement)
        if not assignment or not _TORCH_OP.search(assignment["call"]):
            continue
        later = " ".join(statements[index + 1:])
        if not re.search(rf"\b{assignment['name']}\b", later):
            dead += code_ops(assignment["call"])[:1]
    return dead


def code_ops(code: str) -> list[str]:
    """The aten ops a graph's printed code calls, in order (`torch.ops.aten.relu.default` -> relu)."""
    return [match["op"] or match["py"] for match in _TORCH_OP.finditer(code)]


def describe_programs(paths: Sequence[Path], log: Path) -> dict[str, dict[str, Any]]:
    """Each .pt2's ops and dynamic dims (corpus_models.describe_program), read in one child."""
    existing = [str(path) for path in paths if path.exists()]
    if not existing:
        return {}
    command = [sys.executable, str(Path(__file__).resolve()), "--describe", *existing]
    returncode, _, output = run_logged(command, log, env=bench_env(), timeout_s=600)
    line = next((line for line in reversed(output.splitlines()) if line.startswith("{")), None)
    if returncode != 0 or line is None:
        return {path: {"error": tail(output)} for path in existing}
    return json.loads(line)


def judge(record: dict[str, Any]) -> None:
    """Ours' verdict: a minimal repro of the buggy op, or the reason it is not one."""
    capture, ours = record.get("capture", {}), record.get("ours", {})
    reason = None
    if not capture.get("captured") and capture.get("test_outcome") == "passed":
        reason = "not captured: the test passed and the plugin captured nothing (no failing compile seen)"
    elif not capture.get("captured"):
        reason = f"not captured: test {capture.get('test_outcome')}: {first_line(capture.get('test_message', ''))}"
    elif ours.get("status") != "succeeded":
        reason = f"job {ours.get('status')}: {ours.get('reason')}"
    elif not is_minimal(ours.get("ops", [])):
        reason = f"not minimal: ops left {ours.get('ops')}"
    elif not ours.get("repro", {}).get("reproduces"):
        repro = ours.get("repro", {})
        reason = (f"repro.py does not reproduce: exit {repro.get('exit')}, failed with "
                  f"{repro.get('signature')!r} (report: {ours.get('signature')!r}) {repro.get('output') or ''}")
    elif record["mode"] == "dynamic" and not record.get("dynamic", {}).get("kept"):
        reason = f"dynamic dims lost: {record.get('dynamic')}"
    record["verdict"] = {"minimal_repro": reason is None, "reason": reason}


def is_minimal(ops: Sequence[str]) -> bool:
    """The buggy op alone, beside ops that only read sizes or outputs."""
    kept = [op for op in ops if op not in STRUCTURAL_OPS]
    return len(kept) == 1 and kept[0] in BUGGY_OPS


def first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0][:300] if lines else ""


def minimize_mode(mode: str, cases: Sequence[Case], server: str, out: Path, results: Results,
                  options: argparse.Namespace) -> None:
    """Steps 2 and 3 for a mode's captured cases, `--jobs` at a time; then the dynamic dims."""
    captured = [case for case in cases if results.record(case)["capture"]["captured"]]

    def one(case: Case) -> None:
        record = results.record(case)
        minimize(case, record, server, out, options.job_limit)
        record["ours"]["total_s"] = round((record["capture"]["seconds"] or 0) + record["ours"]["minimize_s"], 1)
        ours = record["ours"]
        say(f"[{mode}] {case.name}: {ours['status']} {ours.get('nodes_original')} -> {ours.get('nodes_final')} "
            f"ops {ours.get('ops')} in {ours['minimize_s']} s; repro {ours.get('repro', {}).get('reproduces')}")
        results.save()

    with ThreadPoolExecutor(max_workers=options.jobs) as pool:
        list(pool.map(one, captured))
    if mode == "dynamic":
        record_dynamic_dims(captured, out, results)
    for case in cases:
        judge(results.record(case))
    results.save()


def rejudge(results: Results, cases: Sequence[Case], out: Path) -> None:
    """Each case's verdict again from its record, the dynamic dims of its programs read anew."""
    dynamic = [case for case in cases if case.mode == "dynamic" and results.record(case)["capture"].get("captured")
               and "ours" in results.record(case)]
    record_dynamic_dims(dynamic, out, results)
    for case in cases:
        judge(results.record(case))
    results.save()


def record_dynamic_dims(cases: Sequence[Case], out: Path, results: Results) -> None:
    """The dynamic dims of each captured program and its minimized.pt2 (one child for all)."""
    paths: dict[str, tuple[Path, Path]] = {}
    for case in cases:
        record = results.record(case)
        entry = record["capture"]["entries"][0]
        paths[case.name] = (Path(record["capture"]["directory"]) / entry["program"],
                            Path(record["ours"].get("artifacts", out)) / "minimized.pt2")
    described = describe_programs([path for pair in paths.values() for path in pair],
                                  out / "logs" / "describe-dynamic.log")
    for case in cases:
        record = results.record(case)
        captured_pt2, minimized_pt2 = paths[case.name]
        captured_dims = described.get(str(captured_pt2), {}).get("dynamic_dims")
        minimized_dims = described.get(str(minimized_pt2), {}).get("dynamic_dims")
        repro_dims = record["ours"].get("repro_dynamic_dims")
        record["dynamic"] = {"captured": captured_dims, "minimized": minimized_dims, "repro": repro_dims,
                             "kept": bool(captured_dims) and bool(minimized_dims) and bool(repro_dims)}


# --- 4. torch's minifier -------------------------------------------------------------------------


def torch_mode(mode: str, cases: Sequence[Case], out: Path, results: Results, options: argparse.Namespace) -> None:
    """Torch's side for one mode: the tests under TORCHDYNAMO_REPRO_AFTER=aot, then each launcher."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dumps = out / "torch" / f"{mode}-{stamp}"
    test_file = write_tests(out / "tests" / f"torch-{mode}-{stamp}", mode, cases)
    # Without inductor's FX graph and AOT autograd caches: a graph the capture step compiled (the
    # wrong-values cases compile fine) would be a cache hit, and after_aot's wrapper, which a hit
    # skips, would never see it: no launcher. A user re-running a suite would meet the same.
    env = bench_env(TORCHDYNAMO_REPRO_AFTER="aot", CORPUS_TORCH_DEBUG_ROOT=str(dumps),
                    TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0")
    if mode == "accuracy":
        env["TORCHDYNAMO_REPRO_LEVEL"] = "4"
    say(f"[{mode}] torch: the tests under TORCHDYNAMO_REPRO_AFTER=aot")
    outcomes = run_tests(test_file, cases, env, out / "logs" / f"torch-dump-{mode}-{stamp}.log")

    def one(case: Case) -> None:
        record = results.record(case)
        launchers = sorted(dumps.glob(f"{case.name}/run_*/minifier/minifier_launcher.py"))
        side: dict[str, Any] = {"dump_s": outcomes[case.architecture]["seconds"]}
        if not launchers:
            side.update(status="no launcher", minimal_repro=False,
                        reason=f"torch wrote no minifier_launcher.py (test {outcomes[case.architecture]['outcome']}: "
                               f"{first_line(outcomes[case.architecture]['message'])})")
        else:
            run_launcher(launchers[-1], out / "torch" / "runs" / case.name, side, options,
                         expected=SIGNATURE_BY_BUG[case.bug])
        record["torch"] = side
        say(f"[{mode}] {case.name}: torch {side['status']}, ops {side.get('ops')}, "
            f"{side.get('seconds')} s, drifted {side.get('drifted')}")
        results.save()

    with ThreadPoolExecutor(max_workers=options.jobs) as pool:
        list(pool.map(one, cases))


def run_launcher(launcher: Path, scratch: Path, side: dict[str, Any], options: argparse.Namespace,
                 expected: str) -> None:
    """`python minifier_launcher.py minify` under the limit, then its repro.py run for its signature."""
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "repro.py").unlink(missing_ok=True)
    command = [sys.executable, str(launcher), "minify", "--isolate" if options.torch_isolate else "--no-isolate"]
    returncode, seconds, output = run_logged(command, scratch / "minify.log", env=bench_env(), cwd=scratch,
                                             timeout_s=options.torch_limit)
    side.update(seconds=round(seconds, 1), exit=returncode, launcher=str(launcher))
    queries = re.search(r"^Made (?P<count>\d+) queries$", output, re.MULTILINE)
    side["queries"] = int(queries["count"]) if queries else None
    if returncode is None:
        side.update(status="timeout", minimal_repro=False, reason=f"no result within {options.torch_limit:.0f} s")
        return
    repro = scratch / "repro.py"
    code = forward_code(repro.read_text()) if queries and repro.exists() else None
    if code is None:
        side.update(status="error", minimal_repro=False, reason=f"no minimized repro.py: {tail(output)}")
        return
    side.update(status="ok", ops_left=count_code_ops(code), ops=code_ops(code), dead_ops=dead_ops(code))
    _, _, run_output = run_logged([sys.executable, "-c", _SIGNATURE_RUNNER, str(repro), "run"],
                                  scratch / "repro-run.log", env=bench_env(), cwd=scratch, timeout_s=REPRO_TIMEOUT_S)
    found = _SIGNATURE_LINE.search(run_output)
    side["signature"] = found["signature"].strip() if found else None
    side["drifted"] = not same_signature(side["signature"], expected)
    side["minimal_repro"] = is_minimal(side["ops"]) and not side["drifted"]
    if not side["minimal_repro"]:
        dead = f" ({', '.join(side['dead_ops'])} dead: its result unused)" if side["dead_ops"] else ""
        side["reason"] = (f"drifted: its repro fails with {side['signature']!r}, the bug with {expected!r}"
                          if side["drifted"] else f"not minimal: ops left {side['ops']}{dead}")


# --- the service ---------------------------------------------------------------------------------


# transformers registers custom ops some models call (Mixtral's experts: `transformers::grouped_mm_fallback`);
# the service's operator allows the worker to import the module that registers them (issue 30, part 3).
SERVICE_ENV = {"MINIFY_ALLOWED_OP_MODULES": "transformers"}


def with_service(out: Path, workers: int, work: Callable[[str], None]) -> None:
    """One `minify-server` (embedded Redis, `workers` workers warmed up as in production) around `work`."""
    sys.path.insert(0, str(REPO))
    from tests.support.service import start_service

    with start_service(out / "service", workers=workers, warm_up=True, timeout_s=600,
                       env=bench_env(**SERVICE_ENV)) as service:
        say(f"minify-server on {service.url} ({workers} worker(s)); dashboard: {service.url}/")
        work(service.url)


# --- the table -----------------------------------------------------------------------------------


def ordered(results: Results) -> list[dict[str, Any]]:
    """The records mode by mode, architectures in the table's order (a resumed run appends)."""
    architectures = list(BY_NAME)
    return sorted(results.cases.values(),
                  key=lambda record: (MODES.index(record["mode"]), architectures.index(record["architecture"])))


def yes_no(value: Any) -> str:
    return "-" if value is None else ("yes" if value else "no")


def render_markdown(results: Results) -> str:
    header = ("case", "captured (graphs)", "ops: captured -> ours", "minimal", "repro reproduces", "dynamic kept",
              "capture s", "minimize s", "total s", "torch", "torch ops left", "torch drifted", "torch s")
    rows = []
    for record in ordered(results):
        capture, ours, side = record.get("capture", {}), record.get("ours", {}), record.get("torch")
        minimal = record.get("verdict", {}).get("minimal_repro")
        dynamic = record.get("dynamic", {}).get("kept") if record["mode"] == "dynamic" else None
        torch_cell = "-" if side is None else torch_outcome(side)
        rows.append((
            record["case"],
            f"{yes_no(capture.get('captured'))} ({capture.get('graphs', 0)})",
            f"{cell(ours.get('nodes_original'))} -> {cell(ours.get('nodes_final'))}",
            yes_no(minimal),
            yes_no(ours.get("repro", {}).get("reproduces")) if ours.get("repro") else "-",
            yes_no(dynamic),
            fmt(capture.get("seconds")), fmt(ours.get("minimize_s")), fmt(ours.get("total_s")),
            torch_cell,
            torch_ops_cell(side),
            "-" if side is None else yes_no(side.get("drifted")),
            "-" if side is None else fmt(side.get("seconds")),
        ))
    lines = ["# Corpus benchmark", "", markdown_table(header, rows), "", summary(results), ""]
    failures = [(record["case"], record["verdict"]["reason"]) for record in ordered(results)
                if record.get("verdict") and not record["verdict"]["minimal_repro"]]
    if failures:
        lines += ["## Cases that did not end in a minimal repro (ours)", ""]
        lines += [f"- `{case}`: {reason}" for case, reason in failures]
        lines.append("")
    torch_failures = [(record["case"], record["torch"].get("reason")) for record in ordered(results)
                      if record.get("torch") and not record["torch"].get("minimal_repro")]
    if torch_failures:
        lines += ["## Torch's minifier: cases without a minimal repro", ""]
        lines += [f"- `{case}`: {reason}" for case, reason in torch_failures]
    return "\n".join(lines) + "\n"


def torch_ops_cell(side: dict[str, Any] | None) -> str:
    """`2 (1 dead)`: torch's ops left, and how many of them nothing reads."""
    if side is None or side.get("ops_left") is None:
        return "-"
    dead = len(side.get("dead_ops") or [])
    return f"{side['ops_left']}" + (f" ({dead} dead)" if dead else "")


def torch_outcome(side: dict[str, Any]) -> str:
    if side.get("minimal_repro"):
        return "minimal"
    if side.get("status") == "ok":
        return "drifted" if side.get("drifted") else "not minimal"
    return side.get("status", "-")


def cell(value: Any) -> str:
    return "-" if value is None else str(value)


def fmt(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}"


def summary(results: Results) -> str:
    """Ours' and torch's rate of minimal repros of the buggy op, overall and per mode."""
    lines = ["| mode | cases | ours: minimal repro | torch: minimal repro |", "|---|---|---|---|"]
    modes = [mode for mode in MODES if any(r["mode"] == mode for r in results.cases.values())]
    for mode in [*modes, "all"]:
        records = [r for r in results.cases.values() if mode in ("all", r["mode"]) and "verdict" in r]
        ours = sum(r["verdict"]["minimal_repro"] for r in records)
        with_torch = [r for r in records if "torch" in r]
        torch_ok = sum(bool(r["torch"].get("minimal_repro")) for r in with_torch)
        rows = f"| {mode} | {len(records)} | {rate(ours, len(records))} | "
        lines.append(rows + (f"{rate(torch_ok, len(with_torch))} |" if with_torch else "- |"))
    return "\n".join(lines)


def rate(count: int, total: int) -> str:
    return f"{count}/{total} ({100 * count / total:.0f}%)" if total else "-"


# --- main ----------------------------------------------------------------------------------------


def check(cases: Sequence[Case]) -> int:
    """In-process: every selected architecture builds, runs eagerly and has a relu."""
    import corpus_models

    bad = 0
    for name in dict.fromkeys(case.architecture for case in cases):
        started = time.monotonic()
        result = corpus_models.check_architecture(name)
        ok = result["error"] is None and result["relus"] > 0
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {name}: {result['relus']} relu of {result['ops']} aten ops "
              f"({time.monotonic() - started:.1f} s){'; ' + result['error'] if result['error'] else ''}", flush=True)
    return 1 if bad else 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("out/corpus"), help="results, captures, artifacts, logs")
    parser.add_argument("--cases", default=".*", help="regex over case names (ARCH-MODE, e.g. 'llama|bert-dynamic')")
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--jobs", type=int, default=1, help="jobs at once (and workers of the service)")
    parser.add_argument("--no-torch", dest="torch", action="store_false", help="skip torch's minifier")
    parser.add_argument("--no-ours", dest="ours", action="store_false",
                        help="skip minify's side (torch's alone, e.g. in another --out beside a --no-torch run)")
    parser.add_argument("--rejudge", action="store_true",
                        help="read the dynamic dims of the selected cases' programs again and re-judge their records "
                             "(after a fix to this harness), running nothing else")
    parser.add_argument("--merge", type=Path, metavar="DIR",
                        help="take torch's side of every case from DIR/results.json into --out's, and re-render")
    parser.add_argument("--resume", action="store_true", help="skip the cases results.json already has done")
    parser.add_argument("--torch-limit", type=float, default=240.0, help="seconds for torch's minifier, per case")
    parser.add_argument("--torch-isolate", action="store_true",
                        help="torch's launcher as by default, a fresh Python per check (slower; default --no-isolate)")
    parser.add_argument("--job-limit", type=float, default=900.0, help="seconds for one of our jobs (job_timeout_s)")
    parser.add_argument("--ours-rev", default="HEAD",
                        help="run minify (plugin, client, server, worker) from this git revision, checked out in "
                             "OUT/src-REV, so a long run is not hit by edits to the tree; 'worktree': the tree")
    parser.add_argument("--check", action="store_true", help="only check that each model builds and has a relu")
    parser.add_argument("--describe", nargs="+", type=Path, help=argparse.SUPPRESS)  # the harness's own child
    options = parser.parse_args(argv)
    unknown = set(options.modes.split(",")) - set(MODES)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}; known: {', '.join(MODES)}")
    return options


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    if options.describe:
        import corpus_models

        print(json.dumps({str(path): corpus_models.describe_program(path) for path in options.describe}))
        return 0
    pattern = re.compile(options.cases)
    selected = [case for case in all_cases(tuple(options.modes.split(","))) if pattern.search(case.name)]
    if not selected:
        print(f"no case matches {options.cases!r}", file=sys.stderr)
        return 2
    if options.check:
        return check(selected)
    out = options.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    global OURS_SOURCE
    OURS_SOURCE = None if options.ours_rev == "worktree" else checkout(options.ours_rev, out)
    results = Results(out / "results.json", options.resume or options.rejudge or options.merge is not None,
                      {"ours_source": str(OURS_SOURCE or "working tree"), "argv": sys.argv[1:]})
    if options.rejudge:
        rejudge(results, [case for case in selected if case.name in results.cases], out)
        (out / "results.md").write_text(render_markdown(results))
        return 0
    if options.merge is not None:
        merge_torch_side(results, options.merge / "results.json")
        (out / "results.md").write_text(render_markdown(results))
        return 0
    pending = [case for case in selected if (options.ours and needs_ours(results.cases.get(case.name)))
               or (options.torch and needs_torch(results.cases.get(case.name)))]
    say(f"{len(selected)} cases selected, {len(pending)} to run; results in {out}")
    modes = [mode for mode in MODES if any(case.mode == mode for case in pending)]
    if not pending:
        (out / "results.md").write_text(render_markdown(results))
        return 0

    def work(server: str) -> None:
        for mode in modes:
            cases = [case for case in pending if case.mode == mode]
            ours_cases = [case for case in cases if options.ours and needs_ours(results.cases.get(case.name))]
            if ours_cases:
                capture(mode, ours_cases, out, results)
                minimize_mode(mode, ours_cases, server, out, results, options)
            torch_cases = [case for case in cases if needs_torch(results.cases.get(case.name))]
            if options.torch and torch_cases:
                torch_mode(mode, torch_cases, out, results, options)
            (out / "results.md").write_text(render_markdown(results))

    if options.ours:
        with_service(out, options.jobs, work)
    else:
        work("")  # torch's side needs no service
    (out / "results.md").write_text(render_markdown(results))
    print((out / "results.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
