"""The files a job delivers, whatever its program: their names, report.json and bundle.tar.gz
written in the engine's process (`write_report`, `write_bundle`), repro.py's header and report.json
rewritten after delivery (`rewrite_for_culprit`, `rewrite_with_header_lines`), and the one rule
for a write the storage refuses (a full disk): an `ArtifactWriteError`, leaving no partial file.
A representation's own files (the program, its inputs, repro.py) are written by its
`artifacts_target` in a sandbox child (programs/fx/artifacts.py, programs/stablehlo/artifacts.py).
"""

from __future__ import annotations

import errno
import gzip
import io
import tarfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from minify_contract.models import Report

ACCURACY_RULES_MODULE = "accuracy_rules"
SIGNATURE_RULES_MODULE = "signature_rules"
# Longest text of one environment entry in repro.py's header.
_MAX_HEADER_TEXT = 300

MINIMIZED = "minimized.pt2"
# Where torch.export cannot export or save the minimal FX program: minify's program.json format
# (minify_contract.program_json), which `minify-worker minify` and a server take back with inputs.pt.
MINIMIZED_JSON = "minimized.json"
INPUTS = "inputs.pt"
REPRO = "repro.py"
SIGNATURE_RULES = f"{SIGNATURE_RULES_MODULE}.py"  # imported by repro.py where it is beside it
ACCURACY_RULES = f"{ACCURACY_RULES_MODULE}.py"  # beside an accuracy repro.py, which judges by it
REPORT = "report.json"
BUNDLE = "bundle.tar.gz"
BUNDLE_FOLDER = "minify-repro"

# What a full disk looks like to a write: no space left, a quota, or a file over the size limit
# (RLIMIT_FSIZE, a filesystem's largest file).
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class ArtifactWriteError(Exception):
    """The storage refused an artifact (disk full, quota, file too large): the job cannot deliver it."""

    def __init__(self, name: str, cause: OSError) -> None:
        super().__init__(f"could not write {name}: {cause.strerror or cause} (errno {cause.errno}); "
                         "the disk that holds the results is full or refuses a file this large")
        self.name = name


def write_artifact(path: Path, write: Callable[[Path], object]) -> None:
    """`write(path)`; when the storage refuses it, the partial file is removed and ArtifactWriteError raised."""
    try:
        write(path)
    except OSError as error:
        if error.errno not in STORAGE_ERRNOS:
            raise
        path.unlink(missing_ok=True)
        raise ArtifactWriteError(path.name, error) from error


def raise_storage_error(result: Mapping[str, Any]) -> None:
    """Raise the ArtifactWriteError a `write_program_artifacts` child met, if it met one."""
    if result.get("storage_error"):
        name, cause = result["storage_error"]
        raise ArtifactWriteError(name, OSError(cause[0], cause[1]))


def header_tail(culprit_lines: list[str] | None, environment: Mapping[str, str] | None, environment_source: str,
                run_line: str) -> list[str]:
    """The end of a repro.py header, whatever the program: the culprit's lines, the environment it
    failed in, how to run it and what it prints."""
    lines: list[str] = []
    if culprit_lines:
        lines += ["", *culprit_lines]
    if environment:
        lines += ["", f"Environment it failed in ({environment_source}):"]
        lines += [f"  {key}: {'; '.join(value.splitlines())[:_MAX_HEADER_TEXT]}" for key, value in environment.items()]
    return [
        *lines,
        "",
        run_line,
        "While the bug is there it exits non-zero with the exception's traceback (a crash: the",
        "process dies by that signal); once fixed it prints 'repro passed' and exits 0.",
    ]


# repro.py's watch for a hang, whatever the program: `watch_for_the_hang()` before compiling, with
# HANG_BOUND_S set (the longest the job saw the result still running); `hang_over(started)` once the
# program ran. Plain Python, no minify import.
WATCH_FOR_THE_HANG = """
def watch_for_the_hang():
    \"\"\"Past HANG_BOUND_S the hang reproduces: say so, print every thread's stack, exit 124 (as timeout(1)
    does). A thread does it; faulthandler too, later, should the stuck thread never let Python run.\"\"\"
    import faulthandler
    import os
    import sys
    import threading
    import time

    def hung():
        print(f"\\nstill compiling or running after {HANG_BOUND_S:g} s, the bound minify saw it hang past",
              file=sys.stderr, flush=True)
        faulthandler.dump_traceback(all_threads=True)
        print("repro failed with: TimedOut", file=sys.stderr, flush=True)
        os._exit(124)

    timer = threading.Timer(HANG_BOUND_S, hung)
    timer.daemon = True
    timer.start()
    faulthandler.dump_traceback_later(HANG_BOUND_S + 30, exit=True)
    return time.monotonic(), timer


def hang_over(started):
    \"\"\"Compiling and running ended within the bound: the hang did not reproduce.\"\"\"
    import faulthandler
    import time

    began, timer = started
    timer.cancel()
    faulthandler.cancel_dump_traceback_later()
    print(f"compiled and ran in {time.monotonic() - began:.1f} s, within the {HANG_BOUND_S:g} s bound")
"""


def hang_notes(bound_s: float | None) -> list[str]:
    """repro.py's header lines for a hang's bound (`WATCH_FOR_THE_HANG`), whatever the program."""
    if not bound_s:
        return []
    return [f"Hang bound:       {bound_s:g} s (minify saw the program still compiling or running after that long):",
            "                  past it the script prints every thread's stack and exits 124; within it, it passes"]


def write_report(report: Report, out_dir: Path) -> Path:
    """report.json: the Report model as JSON."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / REPORT
    text = report.model_dump_json(indent=2) + "\n"
    write_artifact(path, lambda target: target.write_text(text))
    return path


def write_bundle(out_dir: Path) -> Path:
    """bundle.tar.gz of the artifacts present in `out_dir`, under one folder.

    Deterministic (sorted, fixed mtimes and owners): the same artifacts give the same bytes.
    """
    path = out_dir / BUNDLE
    data = _bundle_bytes(out_dir)
    write_artifact(path, lambda target: target.write_bytes(data))
    return path


def _bundle_bytes(out_dir: Path) -> bytes:
    names = [name for name in (MINIMIZED, MINIMIZED_JSON, INPUTS, REPRO, SIGNATURE_RULES, ACCURACY_RULES, REPORT)
             if (out_dir / name).is_file()]
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0) as compressed, \
            tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name in sorted(names):
            data = (out_dir / name).read_bytes()
            info = tarfile.TarInfo(f"{BUNDLE_FOLDER}/{name}")
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def rewrite_for_culprit(out_dir: Path, report: Report, pending_lines: list[str], final_lines: list[str]) -> None:
    """After the culprit phase, which runs once the result is delivered: report.json, repro.py's
    header (`pending_lines` replaced by `final_lines`) and the bundle, each replaced whole by a
    rename, so a download meanwhile gets the delivered file or the new one, never half of one."""
    repro = out_dir / REPRO
    if repro.is_file() and pending_lines:
        text = repro.read_text()
        _replace_whole(repro, text.replace(_commented(pending_lines), _commented(final_lines), 1).encode())
    _replace_report_and_bundle(out_dir, report)


# Lines added to repro.py's header after delivery go before the first of these paragraphs (repro.py's _header).
_LATE_HEADER_ANCHORS = ("# Environment it failed in", "# Run: python repro.py")


def rewrite_with_header_lines(out_dir: Path, report: Report, lines: list[str]) -> None:
    """After the version phase, which also follows the delivered result: `lines` added to repro.py's
    header as a paragraph of their own (before the environment's), then report.json and the bundle,
    each replaced whole by a rename as `rewrite_for_culprit` replaces them."""
    repro = out_dir / REPRO
    if repro.is_file() and lines:
        text = repro.read_text()
        for anchor in _LATE_HEADER_ANCHORS:
            at = text.find("\n" + anchor)
            if at >= 0:
                text = text[:at + 1] + _commented(lines) + "\n#\n" + text[at + 1:]
                break
        _replace_whole(repro, text.encode())
    _replace_report_and_bundle(out_dir, report)


def _replace_report_and_bundle(out_dir: Path, report: Report) -> None:
    _replace_whole(out_dir / REPORT, (report.model_dump_json(indent=2) + "\n").encode())
    if (out_dir / BUNDLE).is_file():
        _replace_whole(out_dir / BUNDLE, _bundle_bytes(out_dir))


def _commented(lines: list[str]) -> str:
    return "\n".join(f"# {line}".rstrip() for line in lines)


def _replace_whole(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.new")
    write_artifact(temporary, lambda target: target.write_bytes(data))
    temporary.replace(path)
