"""The engine end to end with cheap misbehaving backends: real sandbox children, no inductor.

Each test runs `minify_worker.engine.minify` on a program from examples/programs.py with a backend
from tests/support/backends.py that fails, crashes, hangs or raises a different error on
chosen ops, and checks the job ends on the right single op without drifting to another failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from minify_contract.models import JobSpec, JobState, Milestone
from minify_worker.engine import minify
from tests.support.backends import ALLOWED, PREFIX
from tests.support.graphs import ops_of, save_chain

pytestmark = pytest.mark.usefixtures("test_backends_allowed")


def spec(backend: str, parallelism: int = 2, **failure: object) -> JobSpec:
    """A job on a test backend. The phases after minimality (shrink, culprit: each tested in its own
    module) are left out: these tests are about the reduction and its isolation."""
    return JobSpec.model_validate({
        "backend": f"{PREFIX}:{backend}",
        "failure": failure,
        "limits": {"candidate_timeout_s": 4, "parallelism": parallelism},
        "shrink": False,
        "culprit": False,
    })


def test_a_failing_op_is_isolated_from_a_chain(tmp_path: Path) -> None:
    program = save_chain(tmp_path, ("sin", "cos", "exp", "relu", "tanh", "neg", "abs", "sigmoid"))

    result = minify(program, spec("fail_on_relu"), tmp_path / "out")

    assert result.status is JobState.succeeded
    assert ops_of(result.report.graph_code) == ["relu"]
    assert result.report.nodes_original == 8 and result.report.nodes_final == 1
    assert result.report.signature == "RuntimeError: injected failure on relu"
    assert set(result.artifacts) >= {"minimized.pt2", "repro.py", "inputs.pt", "report.json", "bundle.tar.gz"}


def test_a_segfaulting_op_is_isolated_and_the_job_survives(tmp_path: Path) -> None:
    program = save_chain(tmp_path, ("sin", "relu", "cos", "exp"))

    result = minify(program, spec("segfault_on_relu", kind="crash"), tmp_path / "out")

    assert result.status is JobState.succeeded
    assert ops_of(result.report.graph_code) == ["relu"]
    assert result.report.signature == "SIGSEGV"
    assert result.report.failure_kind == "crash"


@pytest.mark.waits
def test_a_hanging_op_costs_one_timeout(tmp_path: Path) -> None:
    # relu raises; without relu, sin hangs. One candidate at a time, so none is cancelled early.
    program = save_chain(tmp_path, ("sin", "cos", "relu"))

    result = minify(program, spec("fail_on_relu_hang_on_sin", parallelism=1), tmp_path / "out")

    assert result.status is JobState.succeeded
    assert ops_of(result.report.graph_code) == ["relu"]
    assert result.report.outcomes.get("timed_out") == 1


def test_a_different_error_on_another_op_does_not_make_the_job_drift(tmp_path: Path) -> None:
    # relu raises RuntimeError; without relu, cos raises ValueError: not the same bug.
    program = save_chain(tmp_path, ("cos", "sin", "relu", "exp"))

    result = minify(program, spec("fail_on_relu_other_error_on_cos"), tmp_path / "out")

    assert result.status is JobState.succeeded
    assert ops_of(result.report.graph_code) == ["relu"]
    assert result.report.outcomes.get("other_failure", 0) >= 1


def test_a_program_that_does_not_fail_is_not_reproducible_with_the_reason(tmp_path: Path) -> None:
    program = save_chain(tmp_path, ("sin", "cos"))

    result = minify(program, spec("fail_on_relu"), tmp_path / "out")

    assert result.status is JobState.not_reproducible
    assert "did not fail" in (result.reason or "")
    assert "passes 3x" in (result.reason or "")  # compiled once, run 3 times
    assert result.report.elapsed_s < 60
    assert (tmp_path / "out" / "report.json").is_file()


def test_a_crash_the_empty_program_shares_is_no_programs_and_its_output_says_where(tmp_path: Path) -> None:
    """An accuracy job on a backend that dies on every graph (on an H200, torch 2.11+cu130 loading
    any AOTInductor CUDA package): not reproducible, the crash said to be no program's, no advice
    to submit it as a crash, and the original's output holds the Python stack it died in."""
    program = save_chain(tmp_path, ("sin", "cos"))

    result = minify(program, spec("crash_on_every_graph", kind="accuracy"), tmp_path / "out")

    assert result.status is JobState.not_reproducible, result.reason
    assert "the program with no ops fails that way too" in (result.reason or "")
    assert (result.report.next_step or "").startswith("no program can be minimized to that failure (SIGSEGV)")
    assert "Fatal Python error: Segmentation fault" in (result.report.original_output or "")
    assert "in crash_on_every_graph" in (result.report.original_output or "")


def test_an_accuracy_bug_is_isolated(tmp_path: Path) -> None:
    program = save_chain(tmp_path, ("sin", "relu", "cos", "exp"))

    result = minify(program, spec("wrong_on_relu", kind="accuracy"), tmp_path / "out")

    assert result.status is JobState.succeeded
    assert ops_of(result.report.graph_code) == ["relu"]
    assert result.report.signature is not None and result.report.signature.startswith("AccuracyError")


class _CastThenSoftmax(torch.nn.Module):
    """`.to(torch.float32)` (transformers' models have them) exports as a float32 dtype assert."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(torch.sin(x).to(torch.float32), -1)


def test_an_accuracy_bug_in_a_program_that_asserts_float32_is_minimized(tmp_path: Path) -> None:
    program = tmp_path / "cast_then_softmax.pt2"
    exported = torch.export.export(_CastThenSoftmax(), (torch.randn(4, 8),)).run_decompositions()
    assert "_assert_tensor_metadata" in str(exported.graph)
    torch.export.save(exported, program)

    # The fp64 reference casts the program: its float32 assert must not fail it.
    result = minify(program, spec("wrong_on_softmax", kind="accuracy"), tmp_path / "out")

    assert result.status is JobState.succeeded, result.reason
    assert ops_of(result.report.graph_code) == ["_softmax"]


def test_a_text_file_named_pt2_is_refused_with_a_clear_reason(tmp_path: Path) -> None:
    program = tmp_path / "notes.pt2"
    program.write_text("this is not an exported program\n")

    result = minify(program, spec("fail_on_relu"), tmp_path / "out")

    assert result.status is JobState.failed
    assert "notes.pt2" in (result.reason or "")
    assert "torch.export" in (result.reason or "")


def test_a_truncated_pt2_is_refused_with_a_clear_reason(tmp_path: Path) -> None:
    program = save_chain(tmp_path, ("sin", "relu"))
    data = program.read_bytes()
    program.write_bytes(data[: len(data) // 2])

    result = minify(program, spec("fail_on_relu"), tmp_path / "out")

    assert result.status is JobState.failed
    assert "chain.pt2" in (result.reason or "")


def test_inputs_that_do_not_match_are_refused_naming_the_problem(tmp_path: Path) -> None:
    program = save_chain(tmp_path, ("sin", "relu"))
    inputs = tmp_path / "inputs.pt"
    torch.save((torch.randn(3, 7),), inputs)

    result = minify(program, spec("fail_on_relu"), tmp_path / "out", inputs=inputs)

    assert result.status is JobState.failed
    assert "shape" in (result.reason or "").lower()


def test_a_backend_the_operator_did_not_allow_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINIFY_ALLOWED_BACKENDS", "somewhere.else")
    program = save_chain(tmp_path, ("sin", "relu"))

    result = minify(program, spec("fail_on_relu"), tmp_path / "out")

    assert result.status is JobState.failed
    assert "MINIFY_ALLOWED_BACKENDS" in (result.reason or "")


def test_a_job_leaves_no_files_in_the_temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    program = save_chain(tmp_path, ("sin", "relu", "cos"))

    result = minify(program, spec("fail_on_relu"), tmp_path / "out")

    assert result.status is JobState.succeeded
    assert os.listdir(temp) == []


def test_the_minimized_program_loads_and_is_a_torch_export_archive(tmp_path: Path) -> None:
    program = save_chain(tmp_path, ("sin", "relu", "cos"))

    result = minify(program, spec("fail_on_relu"), tmp_path / "out")

    minimized = result.artifacts["minimized.pt2"]
    assert zipfile.is_zipfile(minimized)
    module = torch.export.load(minimized).module()
    inputs = torch.load(result.artifacts["inputs.pt"], weights_only=True)
    assert torch.equal(module(*inputs)[0], torch.relu(inputs[0]))


def test_a_job_cancelled_while_preparing_ends_cancelled_at_once(tmp_path: Path) -> None:
    import threading

    program = save_chain(tmp_path, ("sin", "relu"))
    cancel = threading.Event()
    cancel.set()

    result = minify(program, spec("fail_on_relu"), tmp_path / "out", cancel=cancel)

    assert result.status is JobState.cancelled
    assert result.report.checks_total == 0


def test_a_job_cancelled_as_its_original_starts_ends_at_once_without_waiting_for_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    import time
    import uuid

    from minify_contract.models import ProgressEvent
    from minify_worker.environment import ERROR_KEY
    from tests.support.service import MARKER, marked_pids

    # The tools the environment call runs (compilers, lscpu) take 20 s each, as on a loaded machine.
    slow_tools = tmp_path / "bin"
    slow_tools.mkdir()
    for tool in ("gcc", "g++", "clang", "lscpu", "lsb_release"):
        (slow_tools / tool).write_text("#!/bin/sh\nsleep 20\n")
        (slow_tools / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{slow_tools}{os.pathsep}{os.environ['PATH']}")
    marker = uuid.uuid4().hex  # every process the job starts carries it, orphans included
    monkeypatch.setenv(MARKER, marker)
    program = save_chain(tmp_path, ("sin", "relu"))
    hangs = JobSpec.model_validate({"backend": f"{PREFIX}:hang_with_grandchild_on_relu",
                                    "failure": {"kind": "timeout"},
                                    "limits": {"candidate_timeout_s": 120, "parallelism": 2}})
    cancel = threading.Event()
    cancelled_at: list[float] = []

    def on_event(event: ProgressEvent) -> None:
        # Sent right after the original's run is submitted, while the environment is collected.
        if event.milestone is Milestone.original_started and not cancel.is_set():
            cancelled_at.append(time.monotonic())
            cancel.set()

    result = minify(program, hangs, tmp_path / "out", on_event=on_event, cancel=cancel)

    took = time.monotonic() - cancelled_at[0]
    assert result.status is JobState.cancelled
    assert took < 10, f"the cancel took {took:.1f} s"
    assert result.report.environment[ERROR_KEY] == "not collected: the job was cancelled"
    # The fork server kills a cancelled call's child and its process group as it reads the cancel:
    # on a loaded box a moment after the job ended; the tools would sleep on for 20 s.
    deadline = time.monotonic() + 5
    while marked_pids(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marked_pids(marker) == []


def test_a_failure_that_happens_only_sometimes_is_reported_as_flaky(tmp_path: Path,
                                                                   test_backends_allowed: None) -> None:
    program = save_chain(tmp_path, ("sin", "relu"))
    flaky = spec("fail_on_relu").model_copy(update={"backend": f"{PREFIX}:fail_first_run_on_relu"})

    # The original is compiled once and run 3 times in one child: only its first run fails.
    result = minify(program, flaky, tmp_path / "out")

    assert result.report.flaky is True
    assert (result.report.original_runs, result.report.original_failures) == (3, 1)
    assert "flaky" in (result.reason or "")
    assert result.report.signature == "RuntimeError: injected failure on relu"


def test_the_original_is_compiled_once_and_run_three_times(tmp_path: Path) -> None:
    program = save_chain(tmp_path, ("sin", "relu"))

    compile_error = minify(program, spec("fail_on_relu"), tmp_path / "compile")
    runtime_error = minify(program, spec("fail_on_relu_at_runtime"), tmp_path / "runtime")

    # A failure while compiling is one run; a runtime failure shows in every run of one compile.
    assert (compile_error.report.original_runs, compile_error.report.original_failures) == (1, 1)
    assert (runtime_error.report.original_runs, runtime_error.report.original_failures) == (3, 3)
    assert not compile_error.report.flaky and not runtime_error.report.flaky
    assert compile_error.report.original_compiles == runtime_error.report.original_compiles == 1


def test_an_original_that_kills_the_fork_server_fails_the_job_with_the_reason(tmp_path: Path) -> None:
    program = save_chain(tmp_path, ("sin", "relu"))

    result = minify(program, spec("kill_sandbox_on_relu"), tmp_path / "out")

    assert result.status is JobState.failed
    assert "sandbox" in (result.reason or "")
    assert (tmp_path / "out" / "report.json").is_file()


def test_a_candidate_that_kills_the_fork_server_costs_that_candidate_not_the_job(tmp_path: Path) -> None:
    # relu raises; without relu, sin kills the fork server: the sandbox restarts and goes on.
    program = save_chain(tmp_path, ("sin", "cos", "relu"))

    result = minify(program, spec("fail_on_relu_kill_sandbox_on_sin", parallelism=1), tmp_path / "out")

    assert result.status is JobState.succeeded, result.reason
    assert ops_of(result.report.graph_code) == ["relu"]
    assert result.report.outcomes.get("invalid", 0) >= 1
    assert "minimized.pt2" in result.artifacts


def test_the_offline_command_minifies_with_its_fork_server_forked_from_itself(tmp_path: Path) -> None:
    program = save_chain(tmp_path, ("sin", "relu", "cos"))
    env = {**os.environ, **ALLOWED}

    done = subprocess.run([sys.executable, "-m", "minify_worker.cli", "minify", str(program), "--backend",
                           f"{PREFIX}:fail_on_relu", "--no-shrink", "--out", str(tmp_path / "out"), "--json"],
                          capture_output=True, text=True, timeout=300, env=env)

    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)  # one JSON document: the final report, after the culprit phase
    assert ops_of(report["graph_code"]) == ["relu"]
    assert report["sandbox_start"] == "fork"  # the command preloaded itself, as the RQ worker does
    assert report["culprit_state"] == "done"
    assert json.loads((tmp_path / "out" / "report.json").read_text())["culprit_state"] == "done"
    assert (tmp_path / "out" / "repro.py").is_file()


class _SinSumMulRelu(torch.nn.Module):
    """sin -> sum(-1) -> mul -> relu: no op of the chain between sin and relu can be bypassed."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.sin(x).sum(-1) * 2)


def test_a_bug_that_needs_two_ops_joined_by_a_chain_ends_with_the_two_ops(tmp_path: Path) -> None:
    program = tmp_path / "sin_sum_mul_relu.pt2"
    torch.export.save(torch.export.export(_SinSumMulRelu(), (torch.randn(3, 4),)), program)

    result = minify(program, spec("fail_on_sin_and_relu"), tmp_path / "out")

    assert result.status is JobState.succeeded, result.reason
    assert sorted(ops_of(result.report.graph_code)) == ["relu", "sin"]
    assert result.report.nodes_final == 2
