"""Inductor's CPU vector-ISA probe answered from the compile cache's record (sandbox/vec_isa.py):
each process here is a fresh interpreter, as a worker, a spawned fork server or `minify-worker
minify` is, since the probe's verdicts are cached per process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from minify_worker.sandbox import vec_isa

# A fresh process's `pick_vec_isa_remembered(record folder)`: how many probe libraries it loaded in a
# `python -c` (inductor's `VecISA._avx_py_load`), which builds inductor's own check ran, and what
# inductor then picks. With `fail`, inductor's check fails every build of that ISA class. (From torch
# 2.15 inductor skips the load of a library that loaded once on the machine, a `.load_ok` beside it:
# the checks are what the record saves everywhere, the loads before 2.15.)
CHILD = """
import json, subprocess, sys
from pathlib import Path

loads = []
def counted(real):
    def call(command, *args, **kwargs):
        if any("LoadLibrary" in str(part) for part in command):
            loads.append(1)
        return real(command, *args, **kwargs)
    return call
subprocess.run, subprocess.check_call = counted(subprocess.run), counted(subprocess.check_call)

import torch._inductor.cpu_vec_isa as cpu_vec_isa
from minify_worker.sandbox.vec_isa import pick_vec_isa_remembered

checked = []
real_check = cpu_vec_isa.VecISA.check_build
def check_build(self, code):
    checked.append(type(self).__name__)
    return False if type(self).__name__ == sys.argv[2] else real_check(self, code)
cpu_vec_isa.VecISA.check_build = check_build

pick_vec_isa_remembered(Path(sys.argv[1]))
print(json.dumps({"loads": len(loads), "checked": checked, "pick": str(cpu_vec_isa.pick_vec_isa()),
                  "valid": [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]}))
"""


def probe(records: Path, fail: str = "-") -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, str(records), fail], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inductor's dlopen probe as on Linux")
def test_later_processes_take_the_builds_that_passed_probe_the_one_that_failed_and_pick_as_the_probe(
        tmp_path: Path) -> None:
    """Three fresh processes, one record: the first's AVX2 builds fail (as a load timed out would),
    the second probes only those, the third nothing."""
    first = probe(tmp_path, fail="VecAVX2")
    assert first["checked"].count("VecAVX2") == 1 and "avx2" not in first["valid"]
    recorded = json.loads((tmp_path / vec_isa.RECORD_NAME).read_text())
    assert len(recorded["passed"]) == len(first["checked"]) - 1
    assert not any(build.startswith("VecAVX2|") for build in recorded["passed"])

    second = probe(tmp_path)
    assert second["checked"] == ["VecAVX2"] and second["loads"] <= 1 and "avx2" in second["valid"]

    third = probe(tmp_path)
    assert third["checked"] == [] and third["loads"] == 0
    assert (third["pick"], third["valid"]) == (second["pick"], second["valid"])
    assert [path.name for path in tmp_path.iterdir()] == [vec_isa.RECORD_NAME]  # no temp file left


@pytest.mark.fast
@pytest.mark.parametrize("text", ["", "{", "[]", '{"key": {"cpu": "other"}, "passed": ["a"]}',
                                  '{"key": {"cpu": "x86_64"}, "passed": "a"}'])
def test_a_damaged_or_foreign_record_holds_no_build(tmp_path: Path, text: str) -> None:
    record = tmp_path / vec_isa.RECORD_NAME
    record.write_text(text)
    assert vec_isa.read_passed(record, {"cpu": "x86_64"}) == set()


@pytest.mark.fast
def test_a_record_is_read_back_under_its_own_key_only(tmp_path: Path) -> None:
    """A record of another machine, compiler or torch holds nothing: everything is probed again, and
    the record then replaced (`pick_vec_isa_remembered` writes what it probed under its own key)."""
    record = tmp_path / "caches" / vec_isa.RECORD_NAME
    vec_isa.write_passed(record, {"cpu": "x86_64"}, {"VecAVX2|avx2|-mavx2|0123"})
    assert vec_isa.read_passed(record, {"cpu": "x86_64"}) == {"VecAVX2|avx2|-mavx2|0123"}
    assert vec_isa.read_passed(record, {"cpu": "aarch64"}) == set()
    assert vec_isa.read_passed(tmp_path / "missing.json", {"cpu": "x86_64"}) == set()
