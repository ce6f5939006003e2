"""The two minifiers as a user runs them from a shell, each a whole process (bench/run.py):

- `torch-script`: `python minifier_launcher.py`, the script torch writes for a failing compile
  (bench/write_launcher.py writes it with torch's own `dump_to_minify`); its `minify` command
  isolates every check by default (`--isolate`, a fresh Python per check), and we run the default;
- `ours-cli`: `minify-worker minify CASE.pt2 --config KEY=VALUE --out DIR`, defaults kept (the
  shrink and culprit phases on).

Neither writes a result file for the bench: their results are read from what they leave, the
minimal `repro.py` and the stderr of torch's script, `report.json` of ours. Imports no torch.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import DEFAULT_CONFIG, RunResult

BENCH_DIR = Path(__file__).resolve().parent
OUR_COMMAND = Path(sys.executable).with_name("minify-worker")  # the console script beside the venv's python

# Lines of ours' output (stderr's progress lines, stdout's summary) whose arrival the bench times.
FIRST_CANDIDATE_LINE = re.compile(r"\brunning the original\b")  # the original was just submitted to the sandbox
DELIVERED_LINE = re.compile(r"^status: ")  # the summary's first line, printed once the --out files are written
CLI_MARKERS = {"first_candidate": FIRST_CANDIDATE_LINE, "delivered": DELIVERED_LINE}

_QUERIES_LINE = re.compile(r"^Made (?P<count>\d+) queries$", re.MULTILINE)
_ASSIGNMENT = re.compile(r"^\s+\w+ = (?!self\.)")  # one call_function node of a GraphModule's code


def launcher_command(program: Path, spec: dict[str, Any]) -> list[str]:
    """The child that writes `minifier_launcher.py` under its working directory and prints its path."""
    return [sys.executable, str(BENCH_DIR / "write_launcher.py"), str(program),
            "--config", json.dumps(spec["config"]), "--device", spec["device"]]


def script_command(launcher: Path) -> list[str]:
    """`python minifier_launcher.py`, as torch's log line tells the user to run it: `minify`, isolated."""
    return [sys.executable, str(launcher)]


def cli_command(program: Path, spec: dict[str, Any], out_dir: Path, parallelism: int | None,
                culprit: bool) -> list[str]:
    """`minify-worker minify PROGRAM --config KEY=VALUE ... --out DIR`, as a user types it."""
    command = [str(OUR_COMMAND), "minify", str(program)]
    for key, value in spec["config"].items():
        command += ["--config", f"{key}={value if isinstance(value, str) else json.dumps(value)}"]
    if spec["device"] != "cpu":
        command += ["--device", spec["device"]]
    if spec["backend"] != "inductor":
        command += ["--backend", spec["backend"]]
    if spec["kind"] != "compile_error":
        command += ["--failure", spec["kind"]]
    if spec.get("signature"):
        command += ["--signature", spec["signature"]]
    if parallelism:
        command += ["--parallelism", str(parallelism)]
    if not culprit:
        command.append("--no-culprit")
    return [*command, "--out", str(out_dir)]


def spec_from_args(spec_args: Sequence[str]) -> dict[str, Any]:
    """The failure as the bench's children take it (`--config JSON --device D --backend B --kind K`,
    and `--signature TEXT` with run.py --given-signature)."""
    spec: dict[str, Any] = {"config": DEFAULT_CONFIG, "device": "cpu", "backend": "inductor", "kind": "compile_error"}
    for flag, value in zip(spec_args[::2], spec_args[1::2], strict=True):
        name = flag.removeprefix("--")
        spec[name] = json.loads(value) if name == "config" else value
    return spec


def count_code_ops(code: str) -> int:
    """Call_function nodes of a GraphModule's `forward` code: its assignments, attribute reads aside."""
    return sum(1 for line in code.splitlines() if _ASSIGNMENT.match(line))


def forward_code(repro: str) -> str | None:
    """The `forward` of the `Repro` module in a script torch wrote (through its return line)."""
    match = re.search(r"^    def forward\(.*?^        return .*?$", repro, re.MULTILINE | re.DOTALL)
    return match.group(0) if match else None


def script_result(case: str, scratch: Path, log: str) -> RunResult:
    """Torch's script: its own count of checks ("Made N queries", stderr), the minimal graph from the
    `repro.py` its last `dump_state` copies into the working directory."""
    result = RunResult(case=case, minifier="torch-script")
    queries = _QUERIES_LINE.search(log)
    result.checks = int(queries["count"]) if queries else 0
    code = forward_code((scratch / "repro.py").read_text()) if queries and (scratch / "repro.py").exists() else None
    if code is None:
        result.status = "error"
        result.error = "no 'Made N queries' line or no repro.py: the script did not finish"
    else:
        result.final_code = code
        result.ops_final = count_code_ops(code)
    return result


def cli_result(case: str, out_dir: Path) -> RunResult:
    """Ours: everything from the `report.json` the command leaves in --out."""
    result = RunResult(case=case, minifier="ours-cli")
    report_path = out_dir / "report.json"
    if not report_path.exists():
        result.status = "error"
        result.error = f"no {report_path}"
        return result
    report = json.loads(report_path.read_text())
    result.status = "ok" if report["status"] == "succeeded" else "error"
    result.error = None if result.status == "ok" else f"{report['status']}: {report.get('reason')}"
    result.checks = report["checks_total"]
    result.checks_cached = report["checks_cached"]
    result.checks_distinct = report["checks_total"] - report["checks_cached"]
    result.original_runs = report.get("original_runs") or 0
    result.ops_initial = report.get("nodes_original")
    result.ops_final = report.get("nodes_final")
    result.final_code = report.get("graph_code")
    result.outcomes = dict(report.get("outcomes") or {})
    result.phase_s = dict(report.get("phase_s") or {})
    result.sandbox_start = report.get("sandbox_start")
    return result

