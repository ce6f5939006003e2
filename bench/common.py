"""Pieces the benchmark's parent and its per-run children share: the result record, JSON files.

Imports no torch: the parent stays light, and each child imports torch itself, once, fresh.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# The bug every case carries: inductor's C++ backend emits code that does not compile for relu.
DEFAULT_CONFIG: dict[str, Any] = {"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}
# Its signature as a capture records it (`failure.signature`; run.py --given-signature), g++'s
# quotes as it prints them under a UTF-8 locale.
RELU_COMPILE_SIGNATURE = "CppCompileError: \u2018compile\u2019 was not declared in this scope"

# The last two are the commands a user runs, whole processes (bench/commands.py).
MINIFIERS = ("torch", "torch-isolate", "ours", "ours-spawn", "torch-script", "ours-cli")


@dataclass
class RunResult:
    """One minifier on one case, as a child reports it (and the parent completes it)."""

    case: str
    minifier: str
    status: str = "ok"  # ok | timeout | error
    wall_s: float | None = None  # the minify call itself, program already loaded
    repro_s: float | None = None  # ours: the minify call until the result was delivered (the culprit phase follows)
    process_s: float | None = None  # the child from its first line: torch's import in, the interpreter's start not
    cpu_s: float | None = None  # user + system CPU of the child's whole process tree (set by the parent)
    # As the parent times the child, from its spawn: to its exit (imports, loading, preload, teardown
    # included), to the result delivered (ours: on_result, ours-cli: its summary; the others: exit_s),
    # ours-cli: to the original submitted to the sandbox (its "running the original" line).
    exit_s: float | None = None
    delivered_s: float | None = None
    first_candidate_s: float | None = None
    delivered_at: float | None = None  # ours: CLOCK_MONOTONIC at on_result, for the parent's delivered_s
    import_torch_s: list[float] = field(default_factory=list)  # ours-cli: `python -c "import torch"` before, after
    checks: int = 0
    checks_distinct: int | None = None
    checks_cached: int | None = None
    original_runs: int = 0  # ours: runs of the original (compiled once) before reducing (not in its checks_total)
    ops_initial: int | None = None
    ops_final: int | None = None
    inputs_final: int | None = None
    check_s_total: float | None = None
    by_strategy: dict[str, dict[str, float]] = field(default_factory=dict)  # torch's, from its stderr
    outcomes: dict[str, int] = field(default_factory=dict)  # ours: candidate outcomes by kind
    phases: dict[str, float] = field(default_factory=dict)  # ours: when each phase began, seconds
    phase_s: dict[str, float] = field(default_factory=dict)  # ours: seconds in each phase (report.json)
    sandbox_start: str | None = None  # ours: "fork" (preloaded, as a worker) or "spawn"
    preload_s: float | None = None  # ours: the preload before the clock started (a worker pays it once)
    final_code: str | None = None
    error: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunResult:
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        return cls(**known)


def write_json(path: Path, data: Any) -> None:
    """Write atomically, so a parent that kills the child mid-write still reads a whole file."""
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(json.dumps(data, indent=2, default=str))
    os.replace(partial, path)


def result_to_json(result: RunResult) -> dict[str, Any]:
    return asdict(result)


def apply_inductor_config(config: dict[str, Any]) -> None:
    """Set dotted `torch._inductor.config` keys, as the job spec's `config` does in our children."""
    import torch._inductor.config as inductor_config

    for key, value in config.items():
        owner: Any = inductor_config
        *parents, leaf = key.split(".")
        for part in parents:
            owner = getattr(owner, part)
        setattr(owner, leaf, value)
