"""Hang capture (capture/crash.py, `--hang SECONDS` / MINIFY_CAPTURE_HANG): a compile that never
returns, or a compiled graph's first run that never returns, is stopped by the supervisor once it
has lasted past the bound, its Python stack printed, and captured as a timeout that the worker's
engine minimizes; a program that does not hang runs as it would without the capture; a bound that
is no number of seconds is refused before anything runs.

The hangs are real: test backends that sleep forever while compiling a graph with relu
(tests.support.backends.hang_on_relu) or in its first run (dying_backends.hang_at_run_on_relu).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from minify_client.capture import crash
from minify_contract.models import JobSpec, JobState
from minify_worker.engine import HangCalibration, minify
from minify_worker.programs.fx.backends import ALLOWED_BACKENDS_ENV
from tests.support.captures import no_pending, only_entry
from tests.support.graphs import ops_of
from tests.support.subprocesses import run_clean

REPO = Path(__file__).resolve().parents[3]
SUITE = REPO / "tests" / "crash_suite"
BOUND_S = "2"

SCRIPT = textwrap.dedent("""
    import sys
    import torch
    from tests.support import backends, dying_backends

    backend = backends.hang_on_relu if sys.argv[1] == "compile" else dying_backends.hang_at_run_on_relu
    print("sin", torch.compile(torch.sin, backend=backend)(torch.ones(2)).tolist(), flush=True)
    torch.compile(lambda x: torch.tanh(torch.relu(x) * 2), backend=backend)(torch.randn(4, 3))
    print("survived", flush=True)
""")


def _run(command: list[str], cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return run_clean(command, cwd, timeout_s=300, **extra)


def _capture_hang(tmp_path: Path, where: str) -> dict:
    """`python -m minify_client.capture --hang 2` of SCRIPT hanging `where`: checks what the runner
    said and wrote, returns the capture's entry."""
    (tmp_path / "script.py").write_text(SCRIPT)
    started = time.monotonic()
    captured = _run([sys.executable, "-m", "minify_client.capture", "--hang", BOUND_S, "--dir", "caps",
                     "script.py", where], tmp_path)
    assert captured.returncode == crash.HUNG_EXIT, captured.stderr[-3000:]
    assert time.monotonic() - started < 120  # stopped at the bound, not waited out
    assert "sin [" in captured.stdout and "survived" not in captured.stdout
    assert re.search(rf"has lasted \d+ s, past {crash.HANG_ENV}=2: a hang", captured.stderr)
    assert "in backend" in captured.stderr or "in run" in captured.stderr  # its stack, where it hung
    entry = only_entry(tmp_path / "caps")
    phase = "compile" if where == "compile" else "first run"
    assert (entry["kind"], entry["signature"], entry["tests"]) == (
        "hang", f"hang: its {phase} lasted past 2 s", ["script.py"])
    assert "graph that hung" in captured.stderr
    spec = json.loads((tmp_path / "caps" / entry["spec"]).read_text())
    assert (spec["failure"]["kind"], spec["failure"]["signature"]) == ("timeout", None)
    backend = "backends:hang_on_relu" if where == "compile" else "dying_backends:hang_at_run_on_relu"
    assert spec["backend"] == f"tests.support.{backend}"
    assert "relu" in ops_of(torch.export.load(tmp_path / "caps" / entry["program"]).graph)
    no_pending(tmp_path / "caps")
    return entry


@pytest.mark.waits
def test_a_compile_that_never_returns_is_captured_and_minimized_as_a_hang(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = _capture_hang(tmp_path, "compile")
    spec = {**json.loads((tmp_path / "caps" / entry["spec"]).read_text()), "culprit": False, "versions": False,
            "shrink": False, "limits": {"parallelism": 2}}
    # The engine in this process, as the RQ worker runs it; its hang calibration's floors scaled down
    # (tests/worker/engine/test_engine_limits.py has the defaults' tests).
    monkeypatch.setenv(ALLOWED_BACKENDS_ENV, "tests.support")
    done = minify(tmp_path / "caps" / entry["program"], JobSpec.model_validate(spec), tmp_path / "out",
                  inputs=tmp_path / "caps" / entry["inputs"],
                  hang=HangCalibration(original_min_s=2.0, confirm_min_s=6.0))
    assert done.status is JobState.succeeded, done.reason
    assert done.report.signature == "TimedOut"
    assert ops_of(torch.export.load(tmp_path / "out" / "minimized.pt2").graph) == ["relu"]


@pytest.mark.waits
def test_a_first_run_that_never_returns_is_captured_as_a_hang(tmp_path: Path) -> None:
    _capture_hang(tmp_path, "run")


@pytest.mark.waits
def test_the_pytest_plugin_stops_a_test_whose_compile_hangs_and_captures_it(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "pytest", "-c", str(SUITE / "suite.ini"), str(SUITE / "case_hang.py"), "-v"]
    captured = _run(command, REPO, MINIFY_CAPTURE_DIR=str(tmp_path / "caps"), MINIFY_CAPTURE_HANG=BOUND_S)
    assert captured.returncode == crash.HUNG_EXIT, captured.stderr[-3000:]
    assert "test_compiles_and_runs PASSED" in captured.stdout
    entry = only_entry(tmp_path / "caps")
    assert (entry["kind"], entry["tests"]) == ("hang", ["case_hang.py::test_compile_hangs"])
    assert "(the test process hung)" in captured.stderr
    no_pending(tmp_path / "caps")


def test_a_program_that_ends_within_the_bound_runs_as_without_the_capture(tmp_path: Path) -> None:
    (tmp_path / "script.py").write_text(textwrap.dedent("""
        import sys
        import torch
        print(torch.compile(lambda x: torch.relu(x) + 1, backend="eager")(torch.ones(2)).tolist())
        sys.exit(4)
    """))
    done = _run([sys.executable, "-m", "minify_client.capture", "--hang", "60", "--dir", "caps", "script.py"],
                tmp_path)
    assert done.returncode == 4 and "[2.0, 2.0]" in done.stdout, done.stderr[-3000:]
    assert not (tmp_path / "caps" / "captures.json").exists()
    no_pending(tmp_path / "caps")


@pytest.mark.parametrize("value", ["soon", "0", "-5", "1e9"])
def test_a_bound_that_is_no_number_of_seconds_is_refused_before_anything_runs(tmp_path: Path, value: str) -> None:
    (tmp_path / "script.py").write_text("open('ran', 'w').close()\n")
    by_runner = _run([sys.executable, "-m", "minify_client.capture", "--dir", "caps", "script.py"], tmp_path,
                     MINIFY_CAPTURE_HANG=value)
    assert by_runner.returncode == 2 and f"MINIFY_CAPTURE_HANG={value!r}" in by_runner.stderr, by_runner.stderr
    (tmp_path / "test_it.py").write_text("def test_it():\n    open('ran', 'w').close()\n")
    by_plugin = _run([sys.executable, "-m", "pytest", "-p", "minify_client.pytest_plugin", "test_it.py"], tmp_path,
                     MINIFY_CAPTURE_DIR="caps", MINIFY_CAPTURE_HANG=value)
    assert by_plugin.returncode == pytest.ExitCode.USAGE_ERROR, by_plugin.stdout + by_plugin.stderr
    assert f"MINIFY_CAPTURE_HANG={value!r}" in by_plugin.stderr
    assert not (tmp_path / "ran").exists()


def test_the_watch_stops_only_processes_past_the_bound(tmp_path: Path) -> None:
    """stop_hung on real processes: one whose pending compile started long ago is stopped and its
    folder marked; one within the bound, and a folder of a process already gone, are left."""
    hung = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    busy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        now = time.time()
        folders = {name: _pending_folder(tmp_path, pid, started)
                   for name, pid, started in (("hung", hung.pid, now - 100), ("busy", busy.pid, now - 1),
                                              ("gone", 2**22 + 7, now - 100))}
        stopped = crash.stop_hung(tmp_path, 30.0, now=now)
        assert [entry.pid for entry in stopped] == [hung.pid]
        assert hung.wait(timeout=30) == -9  # killed at once: it never asked for a stack dump (SIGUSR2)
        assert busy.poll() is None
        marker = json.loads((folders["hung"] / "stopped.json").read_text())
        assert marker == {"phase": "compile", "lasted_s": 100.0, "bound_s": 30.0}
        assert not (folders["busy"] / "stopped.json").exists()
    finally:
        for process in (hung, busy):
            process.kill()
            process.wait()


def test_a_compile_that_ends_while_its_stack_is_dumped_is_not_killed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A compile past the bound that ends during the stack dump drops its pending folder, mark and
    all, and goes on: killing it then would strike whatever it does next (its backward's compile, seen
    adopted as a crash by SIGKILL). Here the process drops its folder when asked for its stack."""
    folder = tmp_path / crash.PENDING / "ending"
    ends = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import shutil, signal, sys, time
        signal.signal(signal.SIGUSR2, lambda *_: shutil.rmtree({str(folder)!r}))
        print("ready", flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert ends.stdout is not None and ends.stdout.readline() == "ready\n"
        folder.mkdir(parents=True)
        _describe(folder, ends.pid, time.time() - 100, dumps_stack=True)
        assert crash.stop_hung(tmp_path, 30.0) == []
        assert ends.poll() is None
        assert f"in process {ends.pid} ended before it was stopped: not a hang" in capsys.readouterr().err
    finally:
        ends.kill()
        ends.wait()


def _pending_folder(directory: Path, pid: int, started: float) -> Path:
    folder = directory / crash.PENDING / f"{pid}-0"
    folder.mkdir(parents=True)
    _describe(folder, pid, started)
    return folder


def _describe(folder: Path, pid: int, started: float, *, dumps_stack: bool = False) -> None:
    (folder / "pending.json").write_text(json.dumps({
        "pid": pid, "test": "t", "key": "k", "level": "dynamo", "backend": "b", "static_reason": None,
        "program": "program.pt2", "phase": "compile", "started": started, "dumps_stack": dumps_stack}))


def test_a_bound_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(crash.HANG_ENV, "90")
    assert crash.hang_limit() == 90.0 and crash.supervision_requested()
    monkeypatch.delenv(crash.HANG_ENV)
    monkeypatch.delenv(crash.CRASH_ENV, raising=False)
    assert crash.hang_limit() is None and not crash.supervision_requested()
    assert os.environ.get(crash.HANG_ENV) is None


# Inductor's compiles stuck by a post-grad pass that never returns on relu (forward) or on relu's
# gradient (`threshold_backward`): an AOTInductor compile of an ExportedProgram, and a compile for
# training, whose backward hangs.
STUCK_PASS = textwrap.dedent("""
    import time
    import torch
    import torch._inductor.config

    def stuck_on(target):
        def stuck(graph):
            while any(node.target is target for node in graph.nodes):
                time.sleep(3600)
        return stuck
""")
AOTI = STUCK_PASS + textwrap.dedent("""
    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x.sin()) + 1

    program = torch.export.export(Model(), (torch.randn(4),))
    torch._inductor.config.post_grad_custom_post_pass = stuck_on(torch.ops.aten.relu.default)
    torch._inductor.aoti_compile_and_package(program)
""")
TRAINING = STUCK_PASS + textwrap.dedent("""
    torch._inductor.config.post_grad_custom_post_pass = stuck_on(torch.ops.aten.threshold_backward.default)
    loss = torch.compile(lambda x: torch.relu(x.sin()).sum())(torch.randn(4, requires_grad=True))
    loss.backward()
""")


@pytest.mark.inductor
@pytest.mark.parametrize(("script", "level", "training"), [(AOTI, "aoti", False), (TRAINING, "dynamo", True)],
                         ids=["aoti", "training"])
def test_an_inductor_compile_that_never_returns_is_captured_as_it_was_compiled(
        tmp_path: Path, script: str, level: str, training: bool) -> None:
    """An AOTInductor compile is watched as the ExportedProgram it was handed; a compile for training
    (grad on, an input requiring grad) is captured for training, so the job compiles its backward."""
    (tmp_path / "script.py").write_text(script)
    done = _run([sys.executable, "-m", "minify_client.capture", "--hang", BOUND_S, "--dir", "caps", "script.py"],
                tmp_path, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor-cache"))
    assert done.returncode == crash.HUNG_EXIT, done.stderr[-3000:]
    entry = only_entry(tmp_path / "caps")
    assert (entry["kind"], entry["level"]) == ("hang", level)
    spec = json.loads((tmp_path / "caps" / entry["spec"]).read_text())
    assert (spec["failure"]["kind"], spec["failure"]["training"]) == ("timeout", training)
    no_pending(tmp_path / "caps")


def test_a_supervisor_whose_child_was_killed_dies_by_the_same_signal(tmp_path: Path) -> None:
    """`crash.end_like` for a child killed by SIGKILL, whose handler cannot be set (it raised)."""
    done = subprocess.run([sys.executable, "-c", "from minify_client.capture import crash; crash.end_like(-9)"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -9, done.stderr
