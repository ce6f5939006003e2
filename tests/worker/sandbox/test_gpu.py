"""The seed's GPU scenarios through the engine, on a CUDA device (`pytest -m gpu`; skipped without one).

torch's own minifier tests (the seed 000_*) inject triton bugs with
`triton.inject_relu_bug_TESTING_ONLY` and expect the after_aot and AOTI minifiers to end on relu,
naming the root cause (a `SyntaxError` in the generated Triton code). Here the same programs go
through `minify_worker.engine` with `device="cuda"`, every candidate in a sandbox child.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from examples import programs
from minify_contract.models import JobSpec, JobState
from minify_worker.engine import MinifyResult, minify
from tests.support.backends import PREFIX
from tests.support.graphs import AOTI_RELU_CODE, ops_of, save_chain

REPO = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.gpu, pytest.mark.inductor,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

def save(tmp_path: Path, builder: str) -> Path:
    ep, _ = programs.BUILDERS[builder]()
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"{builder}.pt2"
    torch.export.save(ep, path)
    return path


def run(tmp_path: Path, builder: str, *, backend: str = "inductor", kind: str = "any",
        device: str = "cuda", **config: str) -> MinifyResult:
    spec = JobSpec.model_validate({"backend": backend, "device": device, "failure": {"kind": kind},
                                   "config": config, "limits": {"original_timeout_s": 300}})
    return minify(save(tmp_path, builder), spec, tmp_path / "out")


def test_after_aot_cuda_compile_error_ends_on_relu_with_the_triton_syntax_error(tmp_path: Path) -> None:
    result = run(tmp_path, "relu_cos", kind="compile_error",
                 **{"triton.inject_relu_bug_TESTING_ONLY": "compile_error"})

    assert result.status is JobState.succeeded, result.reason
    assert ops_of(result.report.graph_code) == ["relu"]
    assert (result.report.signature or "").startswith("SyntaxError"), result.report.signature_chain


def test_after_aot_cuda_accuracy_error_ends_on_relu(tmp_path: Path) -> None:
    result = run(tmp_path, "relu_cos", kind="accuracy", **{"triton.inject_relu_bug_TESTING_ONLY": "accuracy"})

    assert result.status is JobState.succeeded, result.reason
    assert ops_of(result.report.graph_code) == ["relu"]
    assert result.report.signature == "AccuracyError"


AOTI_LOAD = """
import torch
with torch.no_grad():
    x = torch.randn(8, 10, device="cuda")
    program = torch.export.export(torch.nn.Linear(10, 16).to("cuda"), (x,))
    torch._inductor.aoti_load_package(torch._inductor.aoti_compile_and_package(program))(x)
    torch.cuda.synchronize()
"""


def skip_if_torch_cannot_load_a_cuda_aoti_package() -> None:
    """Skip where torch alone, no minify, dies loading a CUDA AOTInductor package (no injected bug):
    every accuracy check must load and run one. So it was on an H200 with torch 2.11.0+cu130:
    SIGSEGV in `_load_aoti`, in a plain interpreter as in the job's children. A torch that loads it
    is a failure of the job, the assertion after this one."""
    done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", AOTI_LOAD], capture_output=True, text=True,
                          timeout=300)
    if done.returncode < 0:
        lines = done.stderr.splitlines()
        current = next((i for i, line in enumerate(lines) if line.startswith("Current thread")), len(lines))
        where = next((line.strip() for line in lines[current:] if line.strip().startswith("File ")), "")
        pytest.skip(f"torch {torch.__version__} itself dies of signal {-done.returncode} loading a CUDA AOTInductor "
                    f"package on this machine (innermost frame: {where or 'unknown'})")


@pytest.mark.parametrize("builder", ["linear_relu_sigmoid", "linear_relu_sigmoid_dict"])
@pytest.mark.parametrize(("bug", "kind", "root"), [("compile_error", "compile_error", "SyntaxError"),
                                                   ("accuracy", "accuracy", "AccuracyError")])
def test_aoti_cuda_errors_end_on_relu_of_a_linear_input(tmp_path: Path, builder: str, bug: str, kind: str,
                                                        root: str) -> None:
    result = run(tmp_path, builder, backend="aot_inductor", kind=kind,
                 **{"triton.inject_relu_bug_TESTING_ONLY": bug})
    if result.status is JobState.not_reproducible and "SIGSEGV" in (result.reason or ""):
        skip_if_torch_cannot_load_a_cuda_aoti_package()

    assert result.status is JobState.succeeded, result.reason
    assert (result.report.signature or "").startswith(root)
    module = torch.export.load(result.artifacts["minimized.pt2"]).module(check_guards=False)
    assert str(module.code).strip() == AOTI_RELU_CODE


def test_a_cpu_job_on_a_gpu_machine_runs_in_a_preloaded_worker(tmp_path: Path) -> None:
    # As an RQ work horse does: preload, then fork the sandbox from there.
    job = JobSpec.model_validate({"backend": "inductor", "device": "cpu", "failure": {"kind": "compile_error"},
                                  "config": {"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}})
    run_ = subprocess.run([sys.executable, "-m", "tests.support.cuda_parent", str(save(tmp_path, "relu_cos")),
                           str(tmp_path / "out"), job.model_dump_json(), "--preload"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run_.returncode == 0, run_.stderr[-4000:]
    result = json.loads(run_.stdout.strip().splitlines()[-1])

    assert result["status"] == "succeeded", result["reason"]
    assert result["sandbox_start"] == "fork"
    assert "aten.relu" in result["graph_code"] and "aten.cos" not in result["graph_code"]
    assert result["signature"].startswith("CppCompileError")


def test_a_candidate_that_trips_a_device_side_assert_costs_one_candidate(tmp_path: Path,
                                                                         test_backends_allowed: None) -> None:
    save_chain(tmp_path, ("sin", "cos", "relu", "tanh", "exp"))
    job = JobSpec.model_validate({"backend": f"{PREFIX}:device_assert_on_relu", "device": "cuda",
                                  "limits": {"candidate_timeout_s": 60}})

    result = minify(tmp_path / "chain.pt2", job, tmp_path / "out")

    assert result.status is JobState.succeeded, result.reason
    assert ops_of(result.report.graph_code) == ["relu"]
    assert "device-side assert" in (result.report.signature or "") or "CUDA error" in (result.report.signature or "")


def test_the_offline_command_minifies_a_cuda_program(tmp_path: Path) -> None:
    program = save(tmp_path, "relu_cos")
    env = {key: value for key, value in os.environ.items() if key != "MINIFY_SANDBOX_START"}

    done = subprocess.run([sys.executable, "-m", "minify_worker.cli", "minify", str(program), "--device", "cuda",
                           "--config", "triton.inject_relu_bug_TESTING_ONLY=compile_error", "--out",
                           str(tmp_path / "out")], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)

    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["status"] == "succeeded" and report["nodes_final"] == 1
