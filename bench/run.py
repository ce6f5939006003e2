"""Benchmark: torch's own minifier against ours, on the same failing graphs, in one run.

    python bench/run.py [--cases ...] [--minifiers torch torch-isolate ours] [--repeat N]
                        [--limit SECONDS] [--json FILE] [--work DIR]

Every case is a flat aten ExportedProgram (core aten plus inductor's decompositions) that fails
to compile under inductor with `cpp.inject_relu_bug_TESTING_ONLY = "compile_error"`
(bench/cases.py). Each run of each minifier is its own child process with its own scratch folder,
emptied first, where every compile cache starts empty, so nothing one run compiled can speed up
another:

- `torch`: torch._functorch.fx_minifier.minifier with after_aot's `inductor_fails` (in-process);
- `torch-isolate`: the same with after_aot's `isolate_fails` (`--isolate`: a fresh Python per check);
- `ours`: minify_worker.engine.minify (isolated by design);
- `torch-script`: `python minifier_launcher.py`, the script torch writes for a failing compile
  (its `minify` command, isolated by default), a whole process (bench/commands.py);
- `ours-cli`: `minify-worker minify CASE.pt2 --config KEY=VALUE --out DIR`, a whole process.

Every run is also timed from the parent, spawn to exit (imports and loading included): a second
table compares the processes. Torch has no time limit of its own; `--limit` bounds every run, and a
run that hits it is shown as "> limit". See docs/bench.md for what the columns mean.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import commands
from common import DEFAULT_CONFIG, MINIFIERS, RELU_COMPILE_SIGNATURE, RunResult, result_to_json

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
CASE_NAMES = ("relu_cos", "transformer_layer", "transformer_stack4", "transformer_layer_core")
DEFAULT_CASES = CASE_NAMES[:3]  # the last shows torch's drift; it is not a speed comparison
# bench/zoo.py's MODELS and FAILURES (it imports torch); the tv_ and hf_ models need torchvision and
# transformers, and are skipped where those do not import.
COMMANDS = ("torch-script", "ours-cli")  # whole processes as a user starts them (bench/commands.py)
ZOO_MODELS = ("resnet", "bert", "gpt2", "tv_resnet18", "tv_mobilenet_v3_small", "hf_bert", "hf_gpt2")
ZOO_FAILURES = ("relu_compile", "relu_accuracy", "two_ops", "softmax_accuracy")


def child_environment(scratch: Path, minifier: str, options: argparse.Namespace) -> dict[str, str]:
    """Same cache policy on both sides: every compile cache empty at the start of every run.

    Torch keeps its graph caches in TORCHINDUCTOR_CACHE_DIR and its precompiled headers under
    TMPDIR (torchinductor_<user>); our engine keeps all of them in MINIFY_CACHE_DIR (a machine-wide
    cache by default). Isolated children inherit the environment. `--shared-caches` leaves both
    sides on their defaults instead (warm from whatever ran before: not comparable run to run).
    """
    env = dict(os.environ)
    ours_source = [str(options.ours_source)] if minifier.startswith("ours") and options.ours_source else []
    paths = [str(BENCH_DIR), *ours_source, str(REPO)]  # REPO: the zoo's backends (tests.support)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*paths, env.get("PYTHONPATH")]))
    env.setdefault("MINIFY_ALLOWED_BACKENDS", "tests.support.backends")  # the zoo's backends
    if options.shared_caches:
        return env
    if minifier.startswith("ours"):
        env["MINIFY_CACHE_DIR"] = str(scratch / "caches")
    else:
        (scratch / "tmp").mkdir(exist_ok=True)
        env["TMPDIR"] = str(scratch / "tmp")
        env["TORCHINDUCTOR_CACHE_DIR"] = str(scratch / "caches" / "inductor")
    return env


WARM_UP_SCRIPT = """
import os
from pathlib import Path
import torch
from torch._inductor.compile_fx import compile_fx
from minify_worker.sandbox.vec_isa import pick_vec_isa_remembered
pick_vec_isa_remembered(Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]))  # the probe, and ours' record of it
with torch.no_grad():
    compiled = compile_fx(torch.fx.symbolic_trace(lambda x: (torch.tan(x) * 2,)), [torch.randn(4, 4)])
    compiled(torch.randn(4, 4))
"""


def build_toolchain(work: Path) -> Path:
    """Compile one unrelated graph into empty caches: what a worker that has run any job before has.

    It holds inductor's CPU ISA probe builds and the precompiled C++ headers (the ~15 s a first
    compile on a machine pays), the record of the probe a worker's warm-up keeps (`vec_isa.json`,
    which torch's minifier and an `--ours-rev` before it never read), and no graph of any case. Each
    run gets a fresh copy of it.
    """
    toolchain = work / "toolchain"
    shutil.rmtree(toolchain, ignore_errors=True)
    (toolchain / "tmp").mkdir(parents=True)
    env = dict(os.environ, TMPDIR=str(toolchain / "tmp"), TORCHINDUCTOR_CACHE_DIR=str(toolchain / "inductor"))
    subprocess.run([sys.executable, "-c", WARM_UP_SCRIPT], env=env, check=True, cwd=toolchain)
    return toolchain


def seed_toolchain(toolchain: Path, scratch: Path, minifier: str) -> None:
    """Copy the warm toolchain where this run's side looks for its caches (see child_environment)."""
    headers = next((toolchain / "tmp").glob("torchinductor_*"), None)
    if minifier.startswith("ours"):
        import torch.version

        inductor = scratch / "caches" / f"torch-{torch.version.__version__}" / "inductor"
        shutil.copytree(toolchain / "inductor", inductor)
        if headers is not None and (headers / "precompiled_headers").is_dir():
            shutil.copytree(headers / "precompiled_headers", inductor / "precompiled_headers", dirs_exist_ok=True)
    else:
        shutil.copytree(toolchain / "inductor", scratch / "caches" / "inductor")
        shutil.copytree(toolchain / "tmp", scratch / "tmp", dirs_exist_ok=True)


@dataclass
class ChildRun:
    """What the parent saw of one child process."""

    returncode: int | None
    timed_out: bool
    exit_s: float  # from the spawn to the exit (the limit for a run killed at it)
    cpu_s: float
    marks: dict[str, float]  # marker name -> seconds from the spawn to the first output line matching it
    spawned_at: float  # CLOCK_MONOTONIC at the spawn


def monotonic_now() -> float:
    """CLOCK_MONOTONIC, system-wide: a child's timestamps (ours' `delivered_at`) compare with the parent's."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def copy_output(stream: IO[bytes], log: IO[bytes], spawned_at: float, markers: dict[str, re.Pattern[str]],
                marks: dict[str, float]) -> None:
    """Copy the child's output into its log line by line, noting when the first line matching each marker came."""
    for line in stream:
        arrived = monotonic_now() - spawned_at
        log.write(line)
        text = line.decode(errors="replace")
        for name, pattern in markers.items():
            if name not in marks and pattern.search(text):
                marks[name] = arrived


def run_child(command: list[str], env: dict[str, str], scratch: Path, limit_s: float,
              markers: dict[str, re.Pattern[str]] | None = None) -> ChildRun:
    """Run one minifier in a fresh process group; kill the whole group at the limit."""
    # The parent runs one child at a time, so the growth of its children's rusage is this child's
    # process tree (every descendant that was reaped; after a kill at the limit, orphans are not, so
    # it is a lower bound there): CPU seconds, which load distorts far less than wall time.
    usage_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    marks: dict[str, float] = {}
    with open(scratch / "log.txt", "wb") as log:
        spawned_at = monotonic_now()
        child = subprocess.Popen(
            command, cwd=scratch, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        assert child.stdout is not None
        reader = threading.Thread(target=copy_output, args=(child.stdout, log, spawned_at, markers or {}, marks))
        reader.start()
        try:
            child.wait(timeout=limit_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        exit_s = monotonic_now() - spawned_at
        # A descendant that outlives the child (an orphan the group kill did not reach) may hold the
        # pipe open: the log is then cut there.
        reader.join(timeout=10)
    usage_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (usage_after.ru_utime - usage_before.ru_utime) + (usage_after.ru_stime - usage_before.ru_stime)
    return ChildRun(child.returncode, timed_out, limit_s if timed_out else exit_s, cpu_s, marks, spawned_at)


def import_torch_s(env: dict[str, str], scratch: Path) -> float:
    """A bare `python -c "import torch"`, spawn to exit: what every side pays before its first line of work."""
    started = monotonic_now()
    subprocess.run([sys.executable, "-c", "import torch"], cwd=scratch, env=env, check=True)
    return monotonic_now() - started


def device_spec_args(device: str) -> list[str]:
    """The failure every case carries, on `device`: inductor's injected relu compile error (C++ on
    the CPU, Triton on CUDA), the same for both sides."""
    config = DEFAULT_CONFIG if device == "cpu" else {"triton.inject_relu_bug_TESTING_ONLY": "compile_error"}
    return ["--config", json.dumps(config), "--device", device]


def run_once(case: str, program: Path, minifier: str, scratch: Path, options: argparse.Namespace,
             spec_args: Sequence[str] = ("--config", json.dumps(DEFAULT_CONFIG))) -> RunResult:
    """`spec_args`: the failure, the same for both sides (`--config JSON`, `--backend`, `--kind`)."""
    # A scratch folder left by an earlier benchmark holds warm caches: start from nothing.
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    result_path = scratch / "result.json"
    env = child_environment(scratch, minifier, options)
    if options.toolchain is not None:
        seed_toolchain(options.toolchain, scratch, minifier)
    if minifier in COMMANDS:
        result = run_command(case, program, minifier, scratch, env, options, spec_args)
    else:
        command = child_command(program, minifier, scratch, options, spec_args)
        command += ["--case", case, "--result", str(result_path)]
        child = run_child(command, env, scratch, options.limit)
        if result_path.exists():
            result = RunResult.from_json(json.loads(result_path.read_text()))
        else:
            result = RunResult(case=case, minifier=minifier, status="error")
            result.error = f"no result (exit {child.returncode}); see {scratch / 'log.txt'}"
        complete(result, child, case, minifier)
        if result.delivered_at is not None:
            result.delivered_s = result.delivered_at - child.spawned_at
    # Compile caches and headers are ~150 MB a run; the log, the result and the artifacts stay.
    for disposable in ("caches", "tmp"):
        shutil.rmtree(scratch / disposable, ignore_errors=True)
    return result


def child_command(program: Path, minifier: str, scratch: Path, options: argparse.Namespace,
                  spec_args: Sequence[str]) -> list[str]:
    """The bench's own child for `minifier` (bench/ours_side.py, bench/torch_side.py)."""
    if minifier.startswith("ours"):
        command = [sys.executable, str(BENCH_DIR / "ours_side.py"), str(program), "--out", str(scratch / "artifacts"),
                   *spec_args]
        if options.parallelism:
            command += ["--parallelism", str(options.parallelism)]
        if options.reuse is not None:
            command += ["--reuse", str(options.reuse)]
        if minifier == "ours-spawn":
            command.append("--no-preload")
        if not options.culprit:
            command.append("--no-culprit")
        return command
    mode = "inprocess" if minifier == "torch" else "isolate"
    return [sys.executable, str(BENCH_DIR / "torch_side.py"), str(program), "--mode", mode, *spec_args]


def run_command(case: str, program: Path, minifier: str, scratch: Path, env: dict[str, str],
                options: argparse.Namespace, spec_args: Sequence[str]) -> RunResult:
    """A minifier as a user runs it (bench/commands.py): the whole process is the run."""
    spec = commands.spec_from_args(spec_args)
    if minifier == "torch-script":
        # What the failing compile wrote; not timed, as the .pt2 ours starts from is not.
        written = subprocess.run(commands.launcher_command(program, spec), cwd=scratch, env=env,
                                 capture_output=True, text=True)
        if written.returncode != 0:
            return RunResult(case=case, minifier=minifier, status="error",
                             error=f"writing minifier_launcher.py failed: {written.stderr.strip()[-500:]}")
        child = run_child(commands.script_command(Path(written.stdout.strip())), env, scratch, options.limit)
        result = commands.script_result(case, scratch, (scratch / "log.txt").read_text(errors="replace"))
    else:
        if options.reuse is not None:
            env["MINIFY_SANDBOX_REUSE"] = str(options.reuse)
        out_dir = scratch / "artifacts"
        command = commands.cli_command(program, spec, out_dir, options.parallelism, options.culprit)
        # A bare import of torch right before and right after: the first candidate counts from there.
        imports = [import_torch_s(env, scratch)]
        child = run_child(command, env, scratch, options.limit, commands.CLI_MARKERS)
        imports.append(import_torch_s(env, scratch))
        result = commands.cli_result(case, out_dir)
        result.import_torch_s = [round(seconds, 3) for seconds in imports]
        result.first_candidate_s = child.marks.get("first_candidate")
        result.delivered_s = child.marks.get("delivered")
        if result.status == "ok" and child.returncode != 0:
            result.status, result.error = "error", f"exit {child.returncode}; see {scratch / 'log.txt'}"
    complete(result, child, case, minifier)
    result.wall_s, result.repro_s = result.exit_s, result.delivered_s
    return result


def complete(result: RunResult, child: ChildRun, case: str, minifier: str) -> None:
    """What the parent knows of a run: its name, a kill at the limit, its CPU and whole-process times."""
    result.case, result.minifier = case, minifier
    if child.timed_out:
        result.status = "timeout"
        result.wall_s = child.exit_s
        result.ops_final = None
    result.cpu_s = child.cpu_s
    result.exit_s = child.exit_s
    if result.process_s is None:
        result.process_s = child.exit_s
    if result.status == "ok" and not minifier.startswith("ours"):
        result.delivered_s = child.exit_s  # torch's minifiers deliver by ending


def median_run(runs: list[RunResult]) -> RunResult:
    """The run whose wall time is the median (the lower one for an even count)."""
    ordered = sorted(runs, key=lambda run: run.wall_s if run.wall_s is not None else float("inf"))
    return ordered[(len(ordered) - 1) // 2]


def format_seconds(run: RunResult, limit_s: float) -> str:
    if run.status == "timeout":
        return f"> {limit_s:.0f}"
    return "-" if run.wall_s is None else f"{run.wall_s:.1f}"


def culprit_s(run: RunResult) -> float | None:
    """Ours: the seconds of the culprit phase (report.json's phase_s), which torch's minifier has no part of."""
    return run.phase_s.get("culprit")


def minify_s(run: RunResult) -> float | None:
    """The time to the repro: ours delivers its result before the culprit phase (`repro_s`; runs
    recorded before that field: the wall time without the phase); torch's is its wall time. What
    the comparisons use: torch's minifier has no culprit phase."""
    if run.repro_s is not None:
        return run.repro_s
    return None if run.wall_s is None else run.wall_s - (culprit_s(run) or 0.0)


def culprit_extra_s(run: RunResult) -> float | None:
    """Ours: the seconds after the result was delivered (the culprit phase and its rewrite of the files)."""
    if run.repro_s is not None and run.wall_s is not None and culprit_s(run) is not None:
        return run.wall_s - run.repro_s
    return culprit_s(run)


def culprit_cell(run: RunResult) -> str:
    """`3.1 (+24%)`: the culprit phase's seconds, and what it adds to the time to the repro."""
    seconds, rest = culprit_extra_s(run), minify_s(run)
    if seconds is None or not rest:
        return "-"
    return f"{seconds:.1f} (+{100 * seconds / rest:.0f}%)"


def culprit_vs_torch(run: RunResult, torch_run: RunResult | None) -> str:
    """The culprit phase's seconds against torch's minifier's whole run (which has no culprit)."""
    seconds = culprit_extra_s(run)
    if seconds is None or torch_run is None or not torch_run.wall_s or torch_run.status != "ok":
        return "-"
    return f"{seconds / torch_run.wall_s:.2f}x"


def render_table(table: dict[str, dict[str, list[RunResult]]], ops: dict[str, int], limit_s: float) -> str:
    header = ("case", "ops", "minifier", "wall s", "repro s", "spread s", "cpu s", "checks", "run", "ops left",
              "torch/ours repro", "culprit s after", "culprit/torch")
    rows: list[tuple[str, ...]] = []
    for case, by_minifier in table.items():
        ours = median_run(by_minifier["ours"]) if "ours" in by_minifier else None
        torch_median = median_run(by_minifier["torch"]) if "torch" in by_minifier else None
        for minifier, runs in by_minifier.items():
            if minifier in COMMANDS:  # no call to time apart from the process: the process table has them
                continue
            run = median_run(runs)
            walls = [r.wall_s for r in runs if r.wall_s is not None and r.status == "ok"]
            spread = f"{max(walls) - min(walls):.1f}" if len(walls) > 1 else "-"
            # The original is compiled once (and run up to 3 times) before the reduction's checks.
            checks_run = run.checks - (run.checks_cached or 0) + (1 if run.original_runs else 0)
            ratio = "-"
            if minifier != "ours" and ours is not None and ours.status == "ok" and run.wall_s:
                ratio = f"{'> ' if run.status == 'timeout' else ''}{run.wall_s / minify_s(ours):.1f}x"
            ops_left = ops_left_cell(run)
            rows.append(
                (
                    case,
                    str(ops[case]),
                    minifier,
                    format_seconds(run, limit_s),
                    "-" if minify_s(run) is None or run.status == "timeout" else f"{minify_s(run):.1f}",
                    spread,
                    "-" if run.cpu_s is None else f"{run.cpu_s:.0f}",
                    str(run.checks),
                    str(checks_run),
                    ops_left,
                    ratio,
                    culprit_cell(run),
                    culprit_vs_torch(run, torch_median) if minifier.startswith("ours") else "-",
                )
            )
    return markdown_table(header, rows)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = [
        "| " + " | ".join(cell.ljust(width) for cell, width in zip(header, widths, strict=True)) + " |",
        "|" + "|".join("-" * (width + 2) for width in widths) + "|",
    ]
    lines += [
        "| " + " | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) + " |" for row in rows
    ]
    return "\n".join(lines)


# Issue 23: each side a whole process, ours against its counterpart, and the most ours may take.
PROCESS_TARGETS = {"ours": ("torch", 0.5), "ours-spawn": ("torch", 0.5), "ours-cli": ("torch-script", 0.75)}
FIRST_CANDIDATE_TARGET_S = 2.0  # ours-cli: the original submitted at most this long after `import torch`


def process_ratios(run: RunResult, against: RunResult) -> tuple[float, float] | None:
    """Ours' whole process and its time to the repro (from the spawn), over its counterpart's whole process."""
    if run.status != "ok" or against.status != "ok" or not against.exit_s or run.exit_s is None:
        return None
    return run.exit_s / against.exit_s, (run.delivered_s or run.exit_s) / against.exit_s


def render_process_table(table: dict[str, dict[str, list[RunResult]]], limit_s: float) -> str:
    """Every run as a whole process, timed by the parent from the spawn (median runs)."""
    header = ("case", "minifier", "process s", "to repro s", "outside the call s", "first candidate s", "cpu s",
              "checks", "ops left", "against", "process ratio", "to repro ratio")
    rows: list[tuple[str, ...]] = []
    for case, by_minifier in table.items():
        for minifier, runs in by_minifier.items():
            run = median_run(runs)
            against, _ = PROCESS_TARGETS.get(minifier, ("-", 0.0))
            ratios = process_ratios(run, median_run(by_minifier[against])) if against in by_minifier else None
            # The call's own clock runs inside the process: the rest is the interpreter, imports,
            # loading the program, ours' preload, the teardown.
            outside = None if minifier in COMMANDS or run.exit_s is None or run.wall_s is None else (
                run.exit_s - run.wall_s)
            rows.append((
                case,
                minifier,
                f"> {limit_s:.0f}" if run.status == "timeout" else seconds_cell(run.exit_s),
                seconds_cell(run.delivered_s),
                seconds_cell(outside),
                seconds_cell(run.first_candidate_s),
                "-" if run.cpu_s is None else f"{run.cpu_s:.0f}",
                str(run.checks),
                ops_left_cell(run),
                against if ratios else "-",
                f"{ratios[0]:.2f}x" if ratios else "-",
                f"{ratios[1]:.2f}x" if ratios else "-",
            ))
    return markdown_table(header, rows)


def ops_left_cell(run: RunResult) -> str:
    return "error" if run.status == "error" else "-" if run.ops_final is None else str(run.ops_final)


def seconds_cell(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}"


def process_summary(table: dict[str, dict[str, list[RunResult]]]) -> list[dict[str, Any]]:
    """Issue 23's whole-process targets, case by case (median runs): the ratios, whether each is
    met, and ours-cli's time from `import torch` to its first candidate. Printed and in --json."""
    summary = []
    for case, by_minifier in table.items():
        for minifier, (against, bound) in PROCESS_TARGETS.items():
            if not by_minifier.get(minifier):  # not run (yet)
                continue
            run = median_run(by_minifier[minifier])
            entry: dict[str, Any] = {"case": case, "minifier": minifier, "against": against, "target": bound}
            counterpart = median_run(by_minifier[against]) if by_minifier.get(against) else None
            entry["status"] = f"{run.status}, {counterpart.status if counterpart else 'not run'}"
            ratios = process_ratios(run, counterpart) if counterpart else None
            if ratios is not None:
                entry.update(process_ratio=ratios[0], to_repro_ratio=ratios[1],
                             process_met=ratios[0] <= bound, to_repro_met=ratios[1] <= bound)
            if run.first_candidate_s is not None and run.import_torch_s:
                import_s = sum(run.import_torch_s) / len(run.import_torch_s)
                after = run.first_candidate_s - import_s
                entry.update(first_candidate_s=run.first_candidate_s, import_torch_s=import_s,
                             first_candidate_after_import_s=after,
                             first_candidate_met=after <= FIRST_CANDIDATE_TARGET_S)
            summary.append(entry)
    return summary


def process_verdicts(summary: list[dict[str, Any]]) -> list[str]:
    lines = []
    for entry in summary:
        head = f"{entry['case']}: {entry['minifier']}"
        if "process_ratio" not in entry:
            lines.append(f"{head} / {entry['against']}: no ratio ({entry['status']})")
        else:
            lines.append(
                f"{head} process <= {entry['target']}x {entry['against']} process: "
                f"{'yes' if entry['process_met'] else 'NO'} ({entry['process_ratio']:.2f}x; to the repro "
                f"{entry['to_repro_ratio']:.2f}x: {'yes' if entry['to_repro_met'] else 'NO'})")
        if "first_candidate_s" in entry:
            lines.append(
                f"{head}: first candidate {entry['first_candidate_after_import_s']:.1f} s after import torch "
                f"(the original submitted {entry['first_candidate_s']:.1f} s after the spawn, a bare import torch "
                f"{entry['import_torch_s']:.1f} s): <= {FIRST_CANDIDATE_TARGET_S:g} s: "
                f"{'yes' if entry['first_candidate_met'] else 'NO'}")
    return lines


def verdicts(table: dict[str, dict[str, list[RunResult]]]) -> list[str]:
    """The targets of issue 2, case by case: ours isolated vs torch in-process and torch --isolate."""
    lines = []
    for case, by_minifier in table.items():
        if "ours" not in by_minifier:
            continue
        ours = median_run(by_minifier["ours"])
        if ours.status != "ok" or ours.wall_s is None:
            lines.append(f"{case}: ours did not finish ({ours.status}: {ours.error})")
            continue
        checks = []
        if "torch" in by_minifier:
            torch_run = median_run(by_minifier["torch"])
            if torch_run.wall_s:
                checks.append(f"time <= torch in-process: {'yes' if minify_s(ours) <= torch_run.wall_s else 'NO'}")
            if torch_run.ops_final is not None and ours.ops_final is not None:
                checks.append(f"ops left <= torch: {'yes' if ours.ops_final <= torch_run.ops_final else 'NO'}")
        if "torch-isolate" in by_minifier:
            isolate = median_run(by_minifier["torch-isolate"])
            if isolate.wall_s:
                speedup = isolate.wall_s / minify_s(ours)
                bound = ">= " if isolate.status == "timeout" else ""
                checks.append(
                    f">= 5x faster than torch --isolate: {'yes' if speedup >= 5 else 'NO'} ({bound}{speedup:.1f}x)"
                )
        # Every case fails through the relu bug: a result without a relu fails some other way.
        for minifier, runs in by_minifier.items():
            final_code = median_run(runs).final_code
            if final_code is not None and "relu" not in final_code:
                checks.append(f"{minifier} DRIFTED: its result has no relu, it fails some other way")
        if checks:
            lines.append(f"{case}: " + "; ".join(checks))
    return lines


def torch_breakdown(table: dict[str, dict[str, list[RunResult]]]) -> list[str]:
    """Where torch's checks went (median run), strategies summed over granularities."""
    lines = []
    for case, by_minifier in table.items():
        for minifier in ("torch", "torch-isolate"):
            if minifier not in by_minifier:
                continue
            run = median_run(by_minifier[minifier])
            families: dict[str, dict[str, float]] = {}
            for strategy, entry in run.by_strategy.items():
                family = families.setdefault(strategy.split(" (G ")[0], dict.fromkeys(entry, 0.0))
                for key, value in entry.items():
                    family[key] = family.get(key, 0.0) + value
            parts = [
                f"{name} {entry['checks']:.0f} ({entry['duplicates']:.0f} dup, {entry['seconds']:.1f} s)"
                for name, entry in sorted(families.items(), key=lambda item: -item[1]["seconds"])
            ]
            distinct = f"{run.checks_distinct} distinct of {run.checks}"
            lines.append(f"{case} / {minifier}: {distinct}; " + "; ".join(parts))
    return lines


def start_op_mismatches(table: dict[str, dict[str, list[RunResult]]], ops: dict[str, int]) -> list[str]:
    """Both sides must start from the same graph: every run's initial op count is the case's."""
    problems = []
    for case, by_minifier in table.items():
        for minifier, runs in by_minifier.items():
            for run in runs:
                if run.ops_initial is not None and run.ops_initial != ops[case]:
                    problems.append(f"{case}/{minifier} started from {run.ops_initial} ops, not {ops[case]}")
    return problems


# Ours as a revision holds them (the shared contract became a package of its own on 2026-11-28).
OURS_PACKAGES = ("worker/minify_worker", "client/minify_client", "contract/minify_contract")


def export_revision(revision: str, work: Path) -> Path:
    """Check out worker/, client/ and contract/ (from 2026-11-28 on) of `revision` into WORK/src-REV;
    return the folder to put on PYTHONPATH.

    Ours is imported from there (PYTHONPATH comes before the editable install), so a benchmark can
    pin a commit while the working tree changes under it. Returns a path holding both packages.
    """
    commit = subprocess.run(
        ["git", "rev-parse", "--short", revision], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    target = work / f"src-{commit}"
    if not target.exists():
        target.mkdir(parents=True)
        listed = subprocess.run(["git", "ls-tree", "--name-only", commit, *OURS_PACKAGES], cwd=REPO,
                                capture_output=True, text=True, check=True).stdout.split()
        packages = [package for package in OURS_PACKAGES if package in listed]
        archive = subprocess.run(["git", "archive", commit, *packages], cwd=REPO, capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
        for package in packages:
            (target / Path(package).name).symlink_to(target / package)
    return target


def git_commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--cases", nargs="+", choices=CASE_NAMES, default=list(DEFAULT_CASES))
    parser.add_argument("--zoo", action="store_true",
                        help="the model zoo instead (bench/zoo.py): every model and failure, ours vs torch in-process")
    parser.add_argument("--models", nargs="+", choices=ZOO_MODELS, default=list(ZOO_MODELS), help="with --zoo")
    parser.add_argument("--failures", nargs="+", choices=ZOO_FAILURES, default=list(ZOO_FAILURES), help="with --zoo")
    parser.add_argument("--minifiers", nargs="+", choices=MINIFIERS, default=["torch", "torch-isolate", "ours"])
    parser.add_argument("--repeat", type=int, default=1, help="runs per case and minifier (median shown)")
    parser.add_argument("--limit", type=float, default=600.0, help="wall-clock limit of one run, seconds")
    parser.add_argument("--parallelism", type=int, default=None, help="ours: candidates at once")
    parser.add_argument("--device", default="cpu",
                        help="cpu or cuda[:N]: cases are built there; on cuda the bug is triton's injected relu bug")
    parser.add_argument("--reuse", type=int, default=None,
                        help="ours: candidates per long-lived sandbox child (MINIFY_SANDBOX_REUSE; 0: a fresh child"
                             " per candidate; default: the worker's choice for the device)")
    parser.add_argument("--json", type=Path, default=None, help="write every run's record here")
    parser.add_argument(
        "--work",
        type=Path,
        default=REPO / "out" / "bench",
        help="programs, scratch folders and logs (default: out/bench)",
    )
    parser.add_argument(
        "--ours-rev",
        default=None,
        help="run ours from this git revision (git archive of worker/, client/ and contract/), not the working tree",
    )
    parser.add_argument("--given-signature", action="store_true",
                        help="ours: the spec gives the signature the case fails with, as a capture does "
                             "(failure.signature): the result goes out before the original's verdict")
    parser.add_argument("--no-culprit", dest="culprit", action="store_false",
                        help="ours: skip the culprit phase (by default it runs, and its seconds are a column)")
    parser.add_argument(
        "--shared-caches", action="store_true", help="leave compile caches on their defaults (warm, shared)"
    )
    parser.add_argument(
        "--warm-toolchain",
        action="store_true",
        help="every run starts from the same warm toolchain (ISA probe, precompiled headers), no graph cached:"
        " a worker's steady state",
    )
    options = parser.parse_args(argv)
    if options.given_signature and options.device != "cpu":
        parser.error("--given-signature knows the CPU relu bug's signature only (C++'s, not Triton's)")
    options.work = options.work.resolve()  # children run in their own scratch folders
    options.ours_source = export_revision(options.ours_rev, options.work) if options.ours_rev else None
    options.commit = git_commit()  # at the start: the tree may move on while the benchmark runs
    options.toolchain = None
    if options.warm_toolchain and not options.shared_caches:
        options.toolchain = build_toolchain(options.work)

    if options.zoo:
        return run_zoo(options)

    from cases import save_case  # imports torch: only after the arguments are known good

    load_before = os.getloadavg()
    started = time.perf_counter()
    programs: dict[str, Path] = {}
    ops: dict[str, int] = {}
    for case in options.cases:
        programs[case], ops[case] = save_case(case, options.work / "programs", options.device)
        print(f"{case}: {ops[case]} ops -> {programs[case]}", flush=True)

    table: dict[str, dict[str, list[RunResult]]] = {
        case: {minifier: [] for minifier in options.minifiers} for case in options.cases
    }
    # Repeats go round the whole grid, so slow drift in machine load spreads over every minifier.
    for repeat in range(options.repeat):
        for case in options.cases:
            for minifier in options.minifiers:
                scratch = options.work / "runs" / case / f"{minifier}-{repeat}"
                spec_args = device_spec_args(options.device)
                if options.given_signature:
                    spec_args += ["--signature", RELU_COMPILE_SIGNATURE]
                run = run_once(case, programs[case], minifier, scratch, options, spec_args)
                table[case][minifier].append(run)
                if options.json:
                    write_record(options.json, table, ops, options, load_before, os.getloadavg())
                print(
                    f"  {case} / {minifier} #{repeat}: {run.status}, "
                    f"{format_seconds(run, options.limit)} s (process {seconds_cell(run.exit_s)} s), "
                    f"{run.checks} checks, "
                    f"{run.ops_initial} -> {run.ops_final} ops" + (f" ({run.error})" if run.error else ""),
                    flush=True,
                )

    load_after = os.getloadavg()
    if any(minifier not in COMMANDS for minifier in options.minifiers):
        print()
        print(render_table(table, ops, options.limit))
        print()
        for line in verdicts(table) + start_op_mismatches(table, ops):
            print(line)
    print("\neach run as a whole process, from its spawn (imports, loading, preload included):\n")
    print(render_process_table(table, options.limit))
    print()
    for line in process_verdicts(process_summary(table)):
        print(line)
    print("\nwhere torch's checks went (checks, duplicates of an earlier check, seconds in them):")
    for line in torch_breakdown(table):
        print("  " + line)
    print(
        f"\nload average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}; "
        f"{os.cpu_count()} cpus; total {time.perf_counter() - started:.0f} s"
    )

    if options.json:
        write_record(options.json, table, ops, options, load_before, load_after)
    return 0


def run_zoo(options: argparse.Namespace) -> int:
    """Every model of the zoo with every failure it can show: ours and torch in-process, one table."""
    import zoo

    started = time.perf_counter()
    rows: list[tuple[str, int, RunResult, RunResult]] = []
    for model in options.models:
        missing = zoo.missing_library(model)
        if missing:
            print(f"{model}: skipped, {missing}", flush=True)
            continue
        for failure_name in options.failures:
            failure = zoo.FAILURES[failure_name]
            saved = zoo.save_zoo_case(model, failure, options.work / "zoo")
            if saved is None:
                print(f"{model} / {failure_name}: skipped (the model has no {failure.needs})", flush=True)
                continue
            program, ops = saved
            case = f"{model}-{failure_name}"
            spec_args = ["--config", json.dumps(failure.config), "--backend", zoo.backend_for(model, failure),
                         "--kind", failure.kind]
            if options.given_signature:
                spec_args += ["--signature", zoo.signature_for(model, failure)]
            runs = {}
            for minifier in ("ours", "torch"):
                scratch = options.work / "runs" / "zoo" / case / minifier
                runs[minifier] = run = run_once(case, program, minifier, scratch, options, spec_args)
                print(f"  {case} / {minifier}: {run.status}, {format_seconds(run, options.limit)} s, "
                      f"{distinct_checks(run)} distinct checks, {run.ops_initial} -> {run.ops_final} ops"
                      + (f" ({run.error})" if run.error else ""), flush=True)
            rows.append((case, ops, runs["ours"], runs["torch"]))
            if options.json:
                options.json.parent.mkdir(parents=True, exist_ok=True)
                options.json.write_text(json.dumps(
                    {"commit": options.commit, "cpus": os.cpu_count(), "limit_s": options.limit,
                     "runs": [result_to_json(run) for _, _, *pair in rows for run in pair]}, indent=2))
    print()
    print(render_zoo_table(rows, options.limit))
    print()
    for line in zoo_verdicts(rows):
        print(line)
    print(f"\nload average (1 min) {os.getloadavg()[0]:.2f}; {os.cpu_count()} cpus; "
          f"total {time.perf_counter() - started:.0f} s")
    return 0


def distinct_checks(run: RunResult) -> int:
    """Candidates actually compiled: torch's distinct ones; ours without memo hits (not counting
    the original's compile)."""
    if run.minifier == "torch":
        return run.checks_distinct or 0
    return run.checks - (run.checks_cached or 0)


def aten_ops(code: str | None) -> list[str]:
    """The ops of a final graph's code, getitems left out."""
    return [line.split("torch.ops.")[1].split("(")[0] for line in (code or "").splitlines() if "torch.ops." in line]


def render_zoo_table(rows: list[tuple[str, int, RunResult, RunResult]], limit_s: float) -> str:
    header = ("case", "ops", "ops left ours", "ops left torch", "checks ours", "checks torch", "checks torch/ours",
              "wall s ours", "wall s torch", "wall torch/ours", "culprit s ours")
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for case, ops, ours, torch_run in rows:
        checks = (distinct_checks(ours), distinct_checks(torch_run))
        walls = (minify_s(ours), torch_run.wall_s)
        cells = (
            case, str(ops),
            *(ops_left_cell(run) for run in (ours, torch_run)),
            *(str(count) for count in checks),
            f"{checks[1] / checks[0]:.1f}x" if checks[0] else "-",
            *(format_seconds(run, limit_s) for run in (ours, torch_run)),
            f"{walls[1] / walls[0]:.1f}x" if walls[0] and walls[1] else "-",
            culprit_cell(ours),
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def zoo_verdicts(rows: list[tuple[str, int, RunResult, RunResult]]) -> list[str]:
    """Issue 14's targets: ops left <= torch's; two-op bugs end with their two ops (getitems aside);
    single-op bugs in at most log2(ops) + 10 distinct checks."""
    lines = []
    for case, ops, ours, torch_run in rows:
        if ours.status != "ok":
            lines.append(f"{case}: ours did not finish ({ours.status}: {ours.error})")
            continue
        checks = []
        if torch_run.ops_final is not None and ours.ops_final is not None:
            checks.append(f"ops left <= torch: {'yes' if ours.ops_final <= torch_run.ops_final else 'NO'}")
        left = aten_ops(ours.final_code)
        if case.endswith("two_ops"):
            checks.append(f"two ops: {'yes' if len(left) == 2 else 'NO'} ({', '.join(left)})")
        else:
            bound = math.log2(ops) + 10
            checks.append(f"one op ({', '.join(left)}) in <= log2(N)+10 = {bound:.0f} checks: "
                          f"{'yes' if len(left) == 1 and distinct_checks(ours) <= bound else 'NO'}")
        lines.append(f"{case}: " + "; ".join(checks))
    return lines


def write_record(
    path: Path,
    table: dict[str, dict[str, list[RunResult]]],
    ops: dict[str, int],
    options: argparse.Namespace,
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
) -> None:
    """The JSON record; rewritten after every run, so a long benchmark cut short keeps what it has."""
    record = {
        "commit": options.commit,
        "ours_source": str(options.ours_source) if options.ours_source else "working tree",
        "shared_caches": options.shared_caches,
        "warm_toolchain": options.toolchain is not None,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_before": load_before,
        "load_after": load_after,
        "limit_s": options.limit,
        "ops": ops,
        "processes": process_summary(table),
        "runs": [
            result_to_json(run) for by_minifier in table.values() for runs in by_minifier.values() for run in runs
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    sys.exit(main())
