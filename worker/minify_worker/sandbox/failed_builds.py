"""A job's failed C++ builds, remembered: the same build fails the same way without the compiler.

Inductor caches the kernels it built, never the builds that failed. On a bug whose generated C++
does not compile, every candidate that still holds the bug compiles the failing kernel again (most
candidates of a reduction cut ops far from that kernel and leave its source as it was), and so does
each probe of the culprit phase whose flag leaves the source unchanged: seconds of g++ for an
answer already known. A C++ compiler given the same source and the same command line says the
same thing, so within one job a build that failed with a compile error is remembered (its command,
its sources' contents) and the next identical build raises inductor's own `CppCompileError`, with
the recorded command and output, without running the compiler: the same signature, the same
message, the same outcome.

Only a compiler's verdict on the code is remembered: a failure that says the build was cut short
or starved (a killed compiler, an internal compiler error, a full disk, no memory) may not recur,
and runs again. The record lives in the job's sandbox (`FOLDER_VARIABLE`, set by the pool for its
server and children: removed with the job), so nothing outlives a job; where the variable is unset
(repro.py, the capture, a process outside a sandbox) every build runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

FOLDER_VARIABLE = "MINIFY_FAILED_BUILDS_DIR"

# Inputs whose contents a build's outcome depends on beyond its command line: sources and objects.
_INPUT_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".o")
# What a compiler or linker prints when the build did not run to its verdict.
_CUT_SHORT = re.compile(
    r"internal compiler error|signal terminated program|\bKilled\b|No space left on device|"
    r"Cannot allocate memory|out of memory|memory exhausted|Resource temporarily unavailable|"
    r"Too many open files|Read-only file system|Input/output error|Interrupted",
    re.IGNORECASE,
)
_VERDICT = re.compile(r"\berror\b", re.IGNORECASE)


def build_remembering_failures(builder: Any, build: Callable[[Any], None]) -> None:
    """`build(builder)`, or the failure an identical build of this job had, raised again."""
    folder = os.environ.get(FOLDER_VARIABLE)
    key = build_key(builder) if folder else None
    if key is None:
        build(builder)
        return
    record = Path(folder) / f"{key}.json"
    remembered = _read(record)
    if remembered is not None:
        error = _error_again(remembered)
        if error is not None:
            raise error
    try:
        build(builder)
    except Exception as error:
        form = _remembered_form(error)
        if form is not None:
            _write(record, form)
        raise


def _remembered_form(error: Exception) -> dict[str, Any] | None:
    """What to record of a failed build: inductor's `CppCompileError` with the compiler's verdict."""
    if type(error).__name__ != "CppCompileError":
        return None
    command, output = getattr(error, "cmd", None), getattr(error, "output", None)
    if not isinstance(command, list | tuple) or not is_compile_verdict(output):
        return None
    return {"cmd": [str(part) for part in command], "output": output, "message": str(error)}


def _error_again(remembered: dict[str, Any]) -> Exception | None:
    """Inductor's error made again from a record, None where this torch's would not read exactly as
    the recorded one (the build then runs: never a failure the compiler did not give)."""
    from torch._inductor.exc import CppCompileError

    try:
        error = CppCompileError(remembered["cmd"], remembered["output"])
    except Exception:
        return None
    return error if str(error) == remembered.get("message") else None


def build_key(builder: Any) -> str | None:
    """What a build's outcome depends on within one job: its command line and the contents of the
    sources and objects it names (None: a builder this cannot read, built as it comes)."""
    command_line = getattr(builder, "get_command_line", None)
    if command_line is None:
        return None
    try:
        command = command_line()
        digest = hashlib.sha256(command.encode())
        for argument in shlex.split(command):
            if argument.endswith(_INPUT_SUFFIXES) and os.path.isfile(argument):
                digest.update(b"\0" + argument.encode() + b"\0")
                digest.update(Path(argument).read_bytes())
    except (OSError, ValueError, TypeError):
        return None
    return digest.hexdigest()


def is_compile_verdict(output: object) -> bool:
    """Whether a failed build's output is the compiler's verdict on the code (it says "error", as
    g++'s `error:` lines and the linker's `collect2: error:` do), not a build cut short or starved,
    which may not fail again."""
    return isinstance(output, str) and bool(_VERDICT.search(output)) and not _CUT_SHORT.search(output)


def _read(record: Path) -> dict[str, Any] | None:
    try:
        remembered = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(remembered, dict) or not isinstance(remembered.get("output"), str):
        return None
    if not isinstance(remembered.get("cmd"), list) or not isinstance(remembered.get("message"), str):
        return None
    return remembered


def _write(record: Path, remembered: dict[str, Any]) -> None:
    """Written whole (a rename), so a child killed mid-write leaves no half record."""
    with contextlib.suppress(OSError):
        record.parent.mkdir(parents=True, exist_ok=True)
        partial = record.with_name(f"partial-{os.getpid()}-{record.name}")
        partial.write_text(json.dumps(remembered))
        os.replace(partial, record)
