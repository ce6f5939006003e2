"""A job's failed C++ builds, remembered (sandbox/failed_builds.py): a build that failed with a
compile error fails again, in the same job, with the same error and without the compiler; a build
cut short is built again; another job, or a process outside a sandbox, builds for itself."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pytest
import torch
from torch._inductor.exc import CppCompileError

from minify_contract.models import JobSpec
from minify_worker.outcomes import Fails
from minify_worker.programs.fx.graph import graph_to_wire
from minify_worker.sandbox import SandboxPool, preload
from minify_worker.sandbox.failed_builds import (
    FOLDER_VARIABLE,
    build_key,
    build_remembering_failures,
    is_compile_verdict,
)
from tests.support import backends
from tests.support.graphs import marked_kernel

RELU_COMPILE_ERROR = JobSpec(backend="inductor", config={"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"})

# A g++ in front of the real one that notes each build of the marked kernel and, while the `cut`
# file exists, fails that build once as a compiler killed for memory does.
_COUNTING_CXX = """#!/bin/bash
marked=""
for argument in "$@"; do
  case "$argument" in *.cpp) grep -q {marker} "$argument" 2>/dev/null && marked=1 ;; esac
done
if [ -n "$marked" ]; then
  echo build >> "{log}"
  if [ -e "{cut}" ]; then
    rm -f "{cut}"
    echo "g++: fatal error: Killed signal terminated program cc1plus" >&2
    echo "compilation terminated." >&2
    exit 1
  fi
fi
exec {gxx} "$@"
"""


@pytest.fixture(scope="module")
def preloaded() -> None:
    """This process a fork origin with inductor warmed up, as a worker makes itself: the pools'
    children share its precompiled headers instead of building them per child."""
    preload()


class Compiler:
    """The counting g++ on PATH for a test's pools, and how many builds of the marked kernel ran."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.marker = f"{random.randrange(10**6, 10**7)}.75"  # a kernel of this test alone
        self.log, self.cut = tmp_path / "builds.log", tmp_path / "cut"
        folder = tmp_path / "bin"
        folder.mkdir()
        cxx = folder / "g++"
        cxx.write_text(_COUNTING_CXX.format(gxx=shutil.which("g++"), marker=self.marker, log=self.log, cut=self.cut))
        cxx.chmod(0o755)
        monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
        self.wire = graph_to_wire(marked_kernel(tmp_path, self.marker, torch.ops.aten.relu.default))

    @property
    def builds(self) -> int:
        return len(self.log.read_text().splitlines()) if self.log.exists() else 0


def run_job(tmp_path: Path, name: str, program: Compiler, candidates: int) -> list[Fails]:
    """`candidates` runs of the marked program, one after another, in one job's sandbox."""
    with SandboxPool(tmp_path / name, tmp_path / "values.pt", RELU_COMPILE_ERROR, parallelism=1,
                     env=backends.ALLOWED) as pool:
        outcomes = [pool.submit(program.wire, timeout_s=300).result(timeout=300) for _ in range(candidates)]
    assert all(isinstance(outcome, Fails) for outcome in outcomes), outcomes
    return outcomes


@pytest.mark.inductor
def test_a_failed_build_fails_again_in_its_job_without_the_compiler_and_another_job_builds_it(
        preloaded: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    program = Compiler(tmp_path, monkeypatch)
    first, again = run_job(tmp_path, "job", program, 2)
    assert program.builds == 1
    assert again.signature == first.signature  # type, key, text and chain: the same failure
    assert "compile" in first.signature.key and first.signature.exc_type == "CppCompileError"
    (elsewhere,) = run_job(tmp_path, "another-job", program, 1)
    assert program.builds == 2
    # The same bug (the command it prints names the building child: whole_builds' partial output).
    assert (elsewhere.signature.exc_type, elsewhere.signature.key) == (first.signature.exc_type, first.signature.key)


@pytest.mark.inductor
def test_a_build_cut_short_is_built_again_and_the_compilers_verdict_then_remembered(
        preloaded: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    program = Compiler(tmp_path, monkeypatch)
    program.cut.touch()
    killed, verdict, again = run_job(tmp_path, "job", program, 3)
    assert "Killed signal" in killed.signature.text
    assert "compile" in verdict.signature.key and verdict.signature != killed.signature
    assert again.signature == verdict.signature
    assert program.builds == 2


class Builder:
    """What `build_key` reads of inductor's `CppBuilder`: its command line."""

    def __init__(self, command: str) -> None:
        self.command = command

    def get_command_line(self) -> str:
        return self.command


@pytest.mark.fast
def test_a_builds_key_is_its_command_and_the_contents_of_its_sources_and_objects(tmp_path: Path) -> None:
    source, obj = tmp_path / "kernel.cpp", tmp_path / "other.o"
    source.write_text("int f() { return 1; }")
    obj.write_bytes(b"\x7fELF")
    command = f"g++ {source} {obj} -shared -fPIC -O3 -o {tmp_path / 'kernel.so'}"
    key = build_key(Builder(command))
    assert key is not None and key == build_key(Builder(command))
    assert build_key(Builder(command.replace("-O3", "-O2"))) != key
    source.write_text("int f() { return 2; }")
    changed_source = build_key(Builder(command))
    assert changed_source != key
    obj.write_bytes(b"\x7fELF2")
    assert build_key(Builder(command)) != changed_source
    assert build_key(object()) is None  # a builder this cannot read is built as it comes
    assert build_key(Builder("g++ 'unbalanced")) is None


@pytest.mark.fast
@pytest.mark.parametrize(("output", "verdict"), [
    ("/tmp/k.cpp:12:5: error: 'compile' was not declared in this scope\n", True),
    ("/usr/bin/ld: k.o: undefined reference to `f'\ncollect2: error: ld returned 1 exit status\n", True),
    ("k.cpp: fatal error: foo.h: No such file or directory\ncompilation terminated.\n", True),
    ("g++: fatal error: Killed signal terminated program cc1plus\ncompilation terminated.\n", False),
    ("k.cpp:3:1: internal compiler error: Segmentation fault\n", False),
    ("/usr/bin/ld: final link failed: No space left on device\ncollect2: error: ld returned 1 exit status\n", False),
    ("cc1plus: out of memory allocating 65536 bytes\n", False),
    ("", False),
])
def test_only_the_compilers_verdict_on_the_code_is_remembered(output: str, verdict: bool) -> None:
    assert is_compile_verdict(output) is verdict


@pytest.mark.fast
def test_a_remembered_failure_is_inductors_own_error_and_nothing_is_remembered_outside_a_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "kernel.cpp"
    source.write_text("compile error!")
    builder = Builder(f"g++ {source} -o {tmp_path / 'kernel.so'}")
    calls = []

    def build(_: Builder) -> None:  # the compiler's verdict, as inductor raises it
        calls.append(1)
        raise CppCompileError(["g++", str(source)], f"{source}:1:1: error: 'compile' does not name a type\n")

    monkeypatch.delenv(FOLDER_VARIABLE, raising=False)
    for _ in range(2):
        with pytest.raises(CppCompileError):
            build_remembering_failures(builder, build)
    assert len(calls) == 2  # outside a sandbox: every build runs
    monkeypatch.setenv(FOLDER_VARIABLE, str(tmp_path / "failed-builds"))
    errors = []
    for _ in range(3):
        with pytest.raises(CppCompileError) as raised:
            build_remembering_failures(builder, build)
        errors.append(raised.value)
    assert len(calls) == 3
    assert {str(error) for error in errors} == {str(errors[0])}
    assert errors[-1].cmd == ["g++", str(source)] and errors[-1].output == errors[0].output
    source.write_text("compile error! (edited)")  # another source: built again
    with pytest.raises(CppCompileError):
        build_remembering_failures(builder, build)
    assert len(calls) == 4
    # A record this torch's error would not read as (another torch's words, a damaged file): built.
    (record,) = [path for path in (tmp_path / "failed-builds").iterdir() if build_key(builder) in path.name]
    record.write_text(json.dumps({**json.loads(record.read_text()), "message": "C++ compile error, in other words"}))
    with pytest.raises(CppCompileError):
        build_remembering_failures(builder, build)
    assert len(calls) == 5
    record.write_text("{")
    with pytest.raises(CppCompileError):
        build_remembering_failures(builder, build)
    assert len(calls) == 6
