"""Inductor's CPU vector-ISA probe, its passing verdicts remembered with the machine's compile cache.

Before its first CPU compile, every process asks which vector ISAs (AVX2, AVX-512, AMX, ...) the CPU
and the compiler support: inductor builds a probe library per ISA and loads each in a `python -c`
subprocess (`VecISA.check_build`), some ten subprocesses and 1.4 CPU-s per process with a warm
cache, 14 s of g++ on a cold one. The answer is the machine's, not a job's: a worker, a fork server
that had to be spawned and each `minify-worker minify` asked it again.

`pick_vec_isa_remembered()` answers inductor's own probe from `vec_isa.json` in the compile cache,
where an earlier process recorded the builds that passed, under a key of everything the answer
rests on: the CPU's flags, the C++ compiler (its path, size and time), torch (version and folder)
and this Python. A build that failed is never recorded (a probe may fail for a passing reason: a
load timed out on a busy machine), so it is probed again; a code or ISA the record lacks is probed
and added. Only inductor's cached verdicts change, as if the probe had run in this process: the
choice, and every kernel built after it, is the one the probe makes. Worker-side only: a user's
program (the capture, repro.py) always probes for itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

RECORD_NAME = "vec_isa.json"


def pick_vec_isa_remembered(cache_dir: Path | None) -> None:
    """Inductor's `pick_vec_isa()`, its builds that passed taken from `cache_dir/vec_isa.json` (and
    those it had to probe recorded there). Without a cache folder, or where this torch's probe is
    not the one this module knows, it is inductor's probe as it is."""
    import torch._inductor.cpu_vec_isa as cpu_vec_isa

    isa_class = getattr(cpu_vec_isa, "VecISA", None)
    original = getattr(isa_class, "check_build", None)
    key = _machine_key() if cache_dir is not None and original is not None else None
    if key is None:
        cpu_vec_isa.pick_vec_isa()
        return
    record = Path(cache_dir) / RECORD_NAME
    known = read_passed(record, key)
    probed: dict[str, bool] = {}

    def check_build(self: Any, code: str) -> bool:
        build = build_key(self, code)
        if build in known:
            return True
        probed[build] = passed = original(self, code)
        return passed

    isa_class.check_build = check_build
    try:
        cpu_vec_isa.pick_vec_isa()
    finally:
        isa_class.check_build = original
    passed = {build for build, ok in probed.items() if ok}
    if passed - known:
        write_passed(record, key, known | passed)
    log.debug("vec ISA: %d builds known, %d probed", len(known), len(probed))


def build_key(isa: Any, code: str) -> str:
    """One probe build: the ISA, its flags at the call (inductor changes them between probes of one
    ISA) and the probe's source."""
    flags = getattr(isa, "_arch_flags", "")
    return f"{type(isa).__name__}|{isa}|{flags}|{hashlib.sha256(code.encode()).hexdigest()[:16]}"


def read_passed(record: Path, key: dict[str, Any]) -> set[str]:
    """The builds recorded as passing under `key`; none for a record that is missing, damaged or
    another machine's, compiler's or torch's."""
    try:
        document = json.loads(record.read_text())
    except (OSError, ValueError):
        return set()
    if not isinstance(document, dict) or document.get("key") != key:
        return set()
    passed = document.get("passed")
    return {build for build in passed if isinstance(build, str)} if isinstance(passed, list) else set()


def write_passed(record: Path, key: dict[str, Any], passed: set[str]) -> None:
    """The record replaced whole (a reader never sees half of it); a cache it cannot write into is
    left as it is."""
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=record.parent, prefix=".vec_isa.")
    except OSError as error:
        log.debug("vec ISA: not recorded: %s", error)
        return
    try:
        with os.fdopen(descriptor, "w") as file:
            json.dump({"key": key, "passed": sorted(passed)}, file)
        os.chmod(temporary, 0o644)  # readable as the cache's other files are (mkstemp makes it 0600)
        os.replace(temporary, record)
    except OSError as error:
        log.debug("vec ISA: not recorded: %s", error)
        with contextlib.suppress(OSError):
            os.unlink(temporary)


def _machine_key() -> dict[str, Any] | None:
    """What the probe's answer rests on, or None where this torch does not say which compiler it
    uses."""
    import torch
    import torch._inductor.cpp_builder as cpp_builder

    compiler_of: Callable[[], str] | None = getattr(cpp_builder, "get_cpp_compiler", None)
    if compiler_of is None:
        return None
    try:
        compiler = _which(compiler_of())
        stat = os.stat(compiler)
    except Exception:  # no compiler, or one inductor refuses: its own probe says so, as ever
        return None
    return {"cpu": platform.machine(), "flags": _cpu_flags(), "compiler": compiler,
            "compiler_stat": [stat.st_size, int(stat.st_mtime)], "torch": torch.__version__,
            "torch_dir": os.path.dirname(torch.__file__), "python": sys.executable}


def _which(command: str) -> str:
    import shutil

    found = shutil.which(command)
    if found is None:
        raise OSError(f"no compiler {command!r} on PATH")
    return os.path.realpath(found)


def _cpu_flags() -> str:
    """The CPU's feature flags as the kernel lists them (/proc/cpuinfo's first `flags` line; the
    machine's name elsewhere)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()

