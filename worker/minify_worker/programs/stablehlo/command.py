"""`backend: command`: an external program compiles or runs the candidate module, the way
llvm-reduce asks an "interestingness test" (a vendor compiler, XLA's `run_hlo_module`).

The spec's config says what to run: `command.argv` (a list, or one string split as a shell would,
never run through a shell), in which `{module}` is the candidate's MLIR text file, `{inputs}` an
`.npz` of its arguments (`arg0`, `arg1`, ...) and `{output}` an `.npz` the command may write with
its outputs (compared against the reference for an accuracy failure). The executable must be
allowed by the worker's operator: its resolved path starts with one of the comma-separated
prefixes in `MINIFY_ALLOWED_COMMANDS`. Exit status 0 passes; another fails with the command's
error output as the message; a command killed by a signal crashed.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .arrays import read_npz

ALLOWED_COMMANDS_ENV = "MINIFY_ALLOWED_COMMANDS"
ARGV_KEY = "command.argv"
EXC_TYPE = "CommandFailed"


class CommandError(Exception):
    """The job's command cannot be used (not set, not found, not allowed)."""


def argv_of(config: Mapping[str, Any]) -> list[str]:
    raw = config.get(ARGV_KEY)
    if not raw:
        raise CommandError(f"backend 'command' needs the command to run: --config {ARGV_KEY}='tool --flag {{module}}'")
    argv = shlex.split(raw) if isinstance(raw, str) else [str(part) for part in raw]
    if not argv:
        raise CommandError(f"{ARGV_KEY} is empty")
    return argv


def resolve(argv: Sequence[str], environment: Mapping[str, str]) -> list[str]:
    """`argv` with its executable resolved to a path the operator allows."""
    found = shutil.which(argv[0])
    if found is None:
        raise CommandError(f"command {argv[0]!r} is not found on this worker")
    path = str(Path(found).resolve())
    prefixes = [prefix.strip() for prefix in environment.get(ALLOWED_COMMANDS_ENV, "").split(",") if prefix.strip()]
    if not any(path.startswith(prefix) for prefix in prefixes):
        raise CommandError(f"command {path!r} is not allowed: the worker's operator allows commands by path prefix "
                           f"in {ALLOWED_COMMANDS_ENV} (now {','.join(prefixes) or 'empty'})")
    return [path, *argv[1:]]


@dataclass(frozen=True)
class Completed:
    """How the command ended: its exit status (negative: the signal that killed it), its output,
    and the arrays it wrote to `{output}`, if it did."""

    returncode: int
    stdout: str
    stderr: str
    outputs: list[np.ndarray] | None


def run(text: str, arrays: Sequence[np.ndarray], config: Mapping[str, Any], workdir: Path) -> Completed:
    """Run the spec's command on the module `text` and its arguments `arrays`, in a fresh folder
    of `workdir` (its working directory)."""
    argv = resolve(argv_of(config), os.environ)
    folder = Path(tempfile.mkdtemp(prefix="command-", dir=workdir))
    paths = {"module": folder / "module.mlir", "inputs": folder / "inputs.npz", "output": folder / "output.npz"}
    paths["module"].write_text(text)
    np.savez(paths["inputs"], **{f"arg{position}": array for position, array in enumerate(arrays)})
    for name, path in paths.items():
        argv = [part.replace("{" + name + "}", str(path)) for part in argv]
    completed = subprocess.run(argv, cwd=folder, capture_output=True, text=True, errors="replace",
                               stdin=subprocess.DEVNULL, check=False)
    outputs = read_npz(paths["output"]) if paths["output"].is_file() else None
    return Completed(completed.returncode, completed.stdout, completed.stderr, outputs)


def failure_message(completed: Completed) -> str:
    """What a failed command said: its error output (else its output), then its exit status."""
    said = completed.stderr.strip() or completed.stdout.strip() or "no output"
    return f"{said}\n(exit status {completed.returncode})"
