"""The worker's environment, as a PyTorch bug report asks for it: gathered by a sandbox child with
torch's own collect_env helpers, recorded in report.json and repro.py's header."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch

from minify_contract.models import JobSpec, JobState
from minify_worker import environment
from minify_worker.engine import minify
from minify_worker.sandbox import SandboxCallError, SandboxPool
from tests.support.backends import PREFIX
from tests.support.graphs import save_chain


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("environment")
    torch.save({"x": torch.randn(2)}, path / "values.pt")
    return path


@pytest.fixture(scope="module")
def pool(workdir: Path) -> Iterator[SandboxPool]:
    with SandboxPool(workdir, workdir / "values.pt", JobSpec(), parallelism=1) as sandbox:
        sandbox.wait_ready(180)
        yield sandbox


def test_a_sandbox_child_reports_python_torch_compiler_and_os(pool: SandboxPool) -> None:
    collected = pool.call(environment.CALL_TARGET, timeout_s=60)

    assert collected["PyTorch version"] == torch.__version__
    assert collected["PyTorch git version"] == torch.version.git_version
    assert collected["CUDA used to build PyTorch"] == str(torch.version.cuda)
    assert collected["Python version"].startswith(".".join(map(str, sys.version_info[:3])))
    assert "Linux" in collected["Python platform"]
    assert collected["OS"] != environment.NOT_COLLECTED
    assert collected["C++ compiler (inductor)"] != environment.NOT_COLLECTED
    gpu_fields = {"GPU models and configuration", "Nvidia driver version", "cuDNN version", "Triton version"}
    assert gpu_fields <= set(collected)


def test_a_hanging_tool_costs_its_timeout_and_only_its_own_fields(workdir: Path, tmp_path: Path) -> None:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "nvidia-smi").write_text("#!/bin/sh\nsleep 60\n")
    (fake_bin / "nvidia-smi").chmod(0o755)
    path = f"{fake_bin}:{os.environ['PATH']}"
    with SandboxPool(workdir, workdir / "values.pt", JobSpec(), parallelism=1, env={"PATH": path}) as sandbox:
        sandbox.wait_ready(180)
        started = time.monotonic()
        collected = sandbox.call(environment.CALL_TARGET, {"command_timeout_s": 0.5}, timeout_s=60)

    assert time.monotonic() - started < 20
    assert collected["GPU models and configuration"] == environment.NOT_COLLECTED
    assert collected["Nvidia driver version"] == environment.NOT_COLLECTED
    assert collected["PyTorch version"] == torch.__version__


def test_a_failed_collection_leaves_what_the_engine_knows_and_the_error() -> None:
    call: Future[dict] = Future()
    call.set_exception(SandboxCallError("a sandbox child died (SIGKILL)", "crashed"))

    collected = environment.collected(call)

    assert collected[environment.ERROR_KEY] == "SandboxCallError: a sandbox child died (SIGKILL)"
    assert collected["PyTorch version"] == torch.__version__


def test_a_minified_job_records_the_environment_in_report_and_repro(tmp_path: Path,
                                                                     test_backends_allowed: None) -> None:
    save_chain(tmp_path, ("sin", "relu", "cos"))
    spec = JobSpec.model_validate({"backend": f"{PREFIX}:fail_on_relu",
                                   "limits": {"candidate_timeout_s": 4, "parallelism": 2}})

    result = minify(tmp_path / "chain.pt2", spec, tmp_path / "out")

    assert result.status is JobState.succeeded
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["environment"]["PyTorch git version"] == torch.version.git_version
    assert environment.ERROR_KEY not in report["environment"]
    # 16 elements: the repro holds its inputs and stays short; the environment is report.json's
    repro = (tmp_path / "out" / "repro.py").read_text()
    assert "inputs = [" in repro and "Environment it failed in" not in repro
