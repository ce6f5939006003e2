"""Crash-safe capture (capture/crash.py): compiled code that kills the process still leaves its
capture, under the capture runner and under a real pytest run; the program ends as it would have
without the capture; the capture reproduces as the same crash in the worker's engine.

The deaths are real: a test backend whose compiled callable calls os.abort(), reads address 0
through ctypes (SIGSEGV) or calls os._exit(3) when its graph has relu
(tests/support/dying_backends.py).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from minify_client.capture import crash
from minify_client.capture.session import CaptureSession
from minify_contract.models import JobSpec, JobState
from minify_worker.engine import minify
from minify_worker.programs.fx.backends import ALLOWED_BACKENDS_ENV
from tests.support.captures import no_pending, only_entry
from tests.support.graphs import ops_of
from tests.support.subprocesses import run_clean

REPO = Path(__file__).resolve().parents[3]
SUITE = REPO / "tests" / "crash_suite"
DEATHS = {"abort": (-signal.SIGABRT, "SIGABRT"), "segfault": (-signal.SIGSEGV, "SIGSEGV"),
          "exit": (3, "ExitStatus: 3")}

SCRIPT = textwrap.dedent("""
    import sys
    import torch
    from tests.support import dying_backends

    backend = getattr(dying_backends, sys.argv[1] + "_at_run_on_relu")
    print("sin", torch.compile(torch.sin, backend=backend)(torch.ones(2)).tolist(), flush=True)
    torch.compile(lambda x: torch.tanh(torch.relu(x) * 2), backend=backend)(torch.randn(4, 3))
    print("survived", flush=True)
""")


def _run(command: list[str], cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return run_clean(command, cwd, timeout_s=600, **extra)


def _capture_by_the_runner(tmp_path: Path, how: str) -> dict:
    """`python -m minify_client.capture --crash` of SCRIPT dying `how`: the capture's entry, after
    checking that the runner ended as the script ends and wrote what a crash capture holds."""
    (tmp_path / "script.py").write_text(SCRIPT)
    captured = _run([sys.executable, "-m", "minify_client.capture", "--crash", "--dir", "caps", "script.py", how],
                    tmp_path)
    returncode, signature = DEATHS[how]  # what `python script.py` ends with (the plugin's test compares them)
    assert captured.returncode == returncode, captured.stderr[-3000:]  # the capture observes
    assert "sin [" in captured.stdout and "survived" not in captured.stdout
    entry = only_entry(tmp_path / "caps")
    assert (entry["kind"], entry["signature"], entry["tests"]) == ("crash", signature, ["script.py"])
    assert f"first run killed the process ({signature})" in captured.stderr
    spec = json.loads((tmp_path / "caps" / entry["spec"]).read_text())
    assert spec["failure"] == {**spec["failure"], "kind": "crash", "signature": signature}
    assert spec["backend"] == f"tests.support.dying_backends:{how}_at_run_on_relu"
    assert "relu" in ops_of(torch.export.load(tmp_path / "caps" / entry["program"]).graph)
    no_pending(tmp_path / "caps")
    return entry


# The segfault is captured by test_the_capture_of_a_crash_reproduces_as_that_crash, which goes on to
# minimize it.
@pytest.mark.parametrize("how", ["abort", "exit"])
def test_runner_captures_a_graph_whose_first_run_kills_the_script(tmp_path: Path, how: str) -> None:
    _capture_by_the_runner(tmp_path, how)


def test_runner_with_crash_capture_leaves_nothing_when_nothing_dies(tmp_path: Path) -> None:
    (tmp_path / "script.py").write_text(textwrap.dedent("""
        import sys
        import torch
        print(torch.compile(lambda x: torch.relu(x) + 1, backend="eager")(torch.ones(2)).tolist())
        sys.exit(4)
    """))
    done = _run([sys.executable, "-m", "minify_client.capture", "--crash", "--dir", "caps", "script.py"], tmp_path)
    assert done.returncode == 4 and "[2.0, 2.0]" in done.stdout
    assert not (tmp_path / "caps" / "captures.json").exists()
    no_pending(tmp_path / "caps")


# One death under pytest (the runner's tests take all three): the plugin's supervision is the same.
def test_pytest_plugin_captures_a_test_whose_compiled_code_kills_pytest(tmp_path: Path) -> None:
    """pytest under the plugin ends as plain pytest does when a test calls os.abort(): killed by
    SIGABRT (DEATHS, as the runner's tests hold `python script.py` to it), the test before it passed."""
    how = "abort"
    command = [sys.executable, "-m", "pytest", "-c", str(SUITE / "suite.ini"), str(SUITE / "case_crash.py"), "-v"]
    captured = _run(command, REPO, CRASH_HOW=how, MINIFY_CAPTURE_DIR=str(tmp_path / "caps"),
                    MINIFY_CAPTURE_CRASH="1")
    assert captured.returncode == DEATHS[how][0], captured.stderr[-3000:]
    assert "test_compiles_and_runs PASSED" in captured.stdout
    entry = only_entry(tmp_path / "caps")
    assert entry["tests"] == ["case_crash.py::test_dies_in_compiled_code"]
    assert (entry["kind"], entry["signature"]) == ("crash", DEATHS[how][1])
    no_pending(tmp_path / "caps")


def test_a_death_no_supervisor_saw_is_adopted_by_the_next_session(tmp_path: Path) -> None:
    """A process that captured unsupervised (as an xdist worker does) leaves its pending capture;
    the next session in the directory adopts it, with no signature: nobody saw how it died."""
    (tmp_path / "script.py").write_text(SCRIPT)
    done = _run([sys.executable, "-m", "minify_client.capture", "--crash", "--dir", "caps", "script.py", "exit"],
                tmp_path, **{crash.SUPERVISED_ENV: "1"})
    assert done.returncode == 3
    assert len(list((tmp_path / "caps" / crash.PENDING).iterdir())) == 1
    adopted = CaptureSession(tmp_path / "caps", crash=True).adopt()
    assert [(entry.kind, entry.tests) for entry in adopted] == [("crash", ["script.py"])]
    spec = json.loads((tmp_path / "caps" / adopted[0].spec).read_text())
    assert spec["failure"]["kind"] == "crash" and spec["failure"]["signature"] is None
    no_pending(tmp_path / "caps")


def test_the_capture_of_a_crash_reproduces_as_that_crash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = _capture_by_the_runner(tmp_path, "segfault")
    # The phases after minimality (the inputs' shrink, the culprit, the versions) left out: they have their own tests.
    spec = {**json.loads((tmp_path / "caps" / entry["spec"]).read_text()), "culprit": False, "versions": False,
            "shrink": False}
    # The engine in this process, as the RQ worker runs it (preloaded: its sandboxes fork from here).
    monkeypatch.setenv(ALLOWED_BACKENDS_ENV, "tests.support")
    done = minify(tmp_path / "caps" / entry["program"], JobSpec.model_validate(spec), tmp_path / "out",
                  inputs=tmp_path / "caps" / entry["inputs"])
    assert done.status is JobState.succeeded, done.reason
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert (report["status"], report["signature"]) == ("succeeded", "SIGSEGV")
    assert ops_of(torch.export.load(tmp_path / "out" / "minimized.pt2").graph) == ["relu"]


@pytest.mark.inductor
def test_runner_captures_an_inductor_kernel_that_segfaults(tmp_path: Path) -> None:
    """A real generated kernel reading far out of bounds: inductor's check on indirect indices off
    (a setting the capture records), an index 2**40 into 16 floats."""
    (tmp_path / "script.py").write_text(textwrap.dedent("""
        import torch
        torch._inductor.config.assert_indirect_indexing = False
        def gather_plus_one(x, index):
            return torch.relu(x[index]) + 1
        torch.compile(gather_plus_one)(torch.randn(16), torch.tensor([1 << 40]))
    """))
    done = _run([sys.executable, "-m", "minify_client.capture", "--crash", "--dir", "caps", "script.py"], tmp_path)
    assert done.returncode == -signal.SIGSEGV, done.stderr[-3000:]
    entry = only_entry(tmp_path / "caps")
    assert (entry["kind"], entry["signature"], entry["backend"]) == ("crash", "SIGSEGV", "inductor")
    spec = json.loads((tmp_path / "caps" / entry["spec"]).read_text())
    # and the compile's thread count (crash.compile_threads), where it has more than one
    assert {key: value for key, value in spec["config"].items() if key != "cpp.threads"} == {
        "assert_indirect_indexing": False}


@pytest.mark.parametrize("returncode", [-signal.SIGSEGV, -signal.SIGABRT, -signal.SIGFPE, -signal.SIGKILL, 3, 1])
def test_a_death_is_signed_as_the_workers_sandbox_signs_it(returncode: int) -> None:
    from minify_worker import oracle

    worker = oracle.crash_signature(-returncode) if returncode < 0 else oracle.exit_signature(returncode)
    assert crash.death_signature(returncode) == (worker.exc_type if returncode < 0 else worker.text)
