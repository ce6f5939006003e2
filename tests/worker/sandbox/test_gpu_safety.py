"""GPU correctness that a CPU machine can prove (issue 11; docs/isolation.md, "CUDA and forks").

- No process that forks candidates initializes CUDA: the engine, a preloaded worker, the fork
  server, forked or spawned. A spy (tests/support/cuda_spy) makes torch report a GPU and records
  every call that would initialize CUDA, with the calling process; only sandbox children (session
  leaders) may make them.
- Errors of the sandbox are never candidate outcomes: a forked sandbox that cannot use CUDA is
  replaced by a spawned one; a fault a fresh sandbox has too fails the job with its cause.
- The failure must depend on the program; signatures name the root cause.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from minify_contract.models import JobSpec, JobState
from minify_worker.engine import MinifyResult, minify
from minify_worker.programs.fx.backends import ALLOWED_BACKENDS_ENV
from minify_worker.sandbox import vec_isa
from minify_worker.sandbox.warmup import compile_cache_variables
from tests.support.backends import PREFIX
from tests.support.graphs import ops_of, save_chain
from tests.support.repro import run_repro

REPO = Path(__file__).resolve().parents[3]
SPY = REPO / "tests" / "support" / "cuda_spy"


pytestmark = pytest.mark.usefixtures("test_backends_allowed")


@pytest.fixture(scope="module")
def chain_pt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_chain(tmp_path_factory.mktemp("programs"), ("sin", "cos", "relu", "tanh"))


def spec(backend: str, **fields: object) -> JobSpec:
    limits = {"candidate_timeout_s": 20, "parallelism": 2, **fields.pop("limits", {})}  # type: ignore[dict-item]
    return JobSpec.model_validate({"backend": backend, "limits": limits, **fields})


def run_as_worker(program: Path, out: Path, jobs: list[JobSpec], *flags: str, spy_log: Path | None = None,
                  environment: dict[str, str] | None = None) -> list[dict[str, object]]:
    """`tests/support/cuda_parent.py` in a fresh process: minify `jobs` one after the other as a worker
    (--preload) or the offline command does; their results, in order."""
    env = {**os.environ, **(environment or {})}
    env.pop("MINIFY_SANDBOX_START", None)
    if spy_log is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(SPY), str(REPO), env.get("PYTHONPATH", "")])
        env["MINIFY_CUDA_SPY_LOG"] = str(spy_log)
    run = subprocess.run([sys.executable, "-m", "tests.support.cuda_parent", str(program), str(out),
                          *(job.model_dump_json() for job in jobs), *flags], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    return [json.loads(line) for line in run.stdout.strip().splitlines()[-len(jobs):]]


def with_the_machines_builds(base: Path) -> None:
    """A compile cache of its own under `base` (MINIFY_CACHE_DIR), cold for inductor's graphs and
    kernels, but with the machine's C++ builds that touch no device: the precompiled headers (a
    link to the machine's folder: 5-25 CPU-s of g++ each, keyed by flags and compiler) and the
    vector-ISA probe's record (sandbox/vec_isa.py)."""
    machine = Path(compile_cache_variables(Path(tempfile.gettempdir()))["TORCHINDUCTOR_CACHE_DIR"])
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINIFY_CACHE_DIR", str(base))
        own = Path(compile_cache_variables(Path(tempfile.gettempdir()))["TORCHINDUCTOR_CACHE_DIR"])
    own.mkdir(parents=True)
    (machine / "precompiled_headers").mkdir(parents=True, exist_ok=True)
    (own / "precompiled_headers").symlink_to(machine / "precompiled_headers", target_is_directory=True)
    if (machine / vec_isa.RECORD_NAME).is_file():
        shutil.copy(machine / vec_isa.RECORD_NAME, own / vec_isa.RECORD_NAME)


def spied_calls(log: Path, job: int | None = None) -> tuple[list[str], list[str]]:
    """(calls made by processes that fork candidates, calls made by sandbox children) from the spy's
    log: of the whole run, or of the run's `job`-th job only (cuda_parent marks where each starts)."""
    lines = log.read_text().splitlines()
    root = next(line.split()[0] for line in lines if line.endswith(" root engine"))
    forbidden, allowed = [], []
    current: int | None = None
    for line in lines:
        pid, leader, name = line.split()
        if leader == "root":
            current = int(name.removeprefix("job-")) if name.startswith("job-") else None
            continue
        if job is not None and current != job:
            continue
        (allowed if leader == "1" and pid != root else forbidden).append(f"{name} (pid {pid})")
    return forbidden, allowed


def test_importing_the_worker_sets_the_nvml_based_cuda_check() -> None:
    env = {key: value for key, value in os.environ.items() if key != "PYTORCH_NVML_BASED_CUDA_CHECK"}
    run = subprocess.run([sys.executable, "-c", "import os, minify_worker; "
                          "print(os.environ['PYTORCH_NVML_BASED_CUDA_CHECK'])"],
                         env=env, capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "1"


# The jobs of `preloaded_worker`, in the order it runs them: the poisoned one last, since its sandbox
# fault sends it to a spawned server.
CPU_JOB, CUDA_JOB, POISONED_JOB = 0, 1, 2


@pytest.fixture(scope="module")
def preloaded_worker(chain_pt2: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, object]], Path]:
    """One preloaded worker process, watched by the CUDA spy, that runs three jobs one after the
    other as an RQ worker does: a CPU job, a CUDA job, and one whose forked sandbox cannot use CUDA
    (--poison). Each job's spied calls are its own (`spied_calls(log, job)`); a process that imports
    torch and preloads costs seconds of CPU, once here instead of once per test."""
    directory = tmp_path_factory.mktemp("preloaded-worker")
    log = directory / "spy.log"
    jobs = [spec(f"{PREFIX}:fail_on_relu"), spec(f"{PREFIX}:fail_on_relu", device="cuda"),
            spec(f"{PREFIX}:cuda_fork_error_when_poisoned")]
    return run_as_worker(chain_pt2, directory / "out", jobs, "--preload", "--poison", spy_log=log,
                         environment={ALLOWED_BACKENDS_ENV: PREFIX}), log


def test_a_preloaded_worker_on_a_gpu_machine_never_initializes_cuda_for_a_cpu_job(
        preloaded_worker: tuple[list[dict[str, object]], Path]) -> None:
    results, log = preloaded_worker
    result = results[CPU_JOB]

    assert result["status"] == "succeeded" and ops_of(result["graph_code"]) == ["relu"]  # type: ignore[arg-type]
    assert result["sandbox_start"] == "fork"
    forbidden, _ = spied_calls(log, CPU_JOB)
    assert forbidden == []


def test_a_preloaded_worker_leaves_cuda_to_the_children_of_a_cuda_job(
        preloaded_worker: tuple[list[dict[str, object]], Path]) -> None:
    results, log = preloaded_worker
    result = results[CUDA_JOB]

    forbidden, allowed = spied_calls(log, CUDA_JOB)
    assert forbidden == []
    assert allowed, "the children of a cuda job use CUDA: the spy must have seen them"
    if not torch.cuda.is_available():  # no GPU here: a sandbox fault, not the bug
        reason = str(result["reason"])
        assert result["status"] == "failed"
        assert "the job's device is unusable in this sandbox child" in reason, reason
        # a CPU build (CI), or a CUDA build (the GPU machines' torch) on a machine without a GPU
        assert "Torch not compiled with CUDA enabled" in reason or "Found no NVIDIA driver" in reason, reason
        assert result["signature"] is None


def test_a_spawned_fork_server_never_initializes_cuda_either(tmp_path: Path) -> None:
    log = tmp_path / "spy.log"
    # Every candidate compiles cold here (a cache of its own): two ops, so that the server forks
    # candidates after the original's runs, and the reduction alone; the phases after it (shrink,
    # the culprit's compiler bisection) only run more candidates in the same kind of children.
    program = save_chain(tmp_path, ("relu", "tanh"))
    job = spec("inductor", config={"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}, shrink=False, culprit=False)
    caches = tmp_path / "caches"
    with_the_machines_builds(caches)

    # Without --preload the fork server is spawned and warms up inductor for a CPU job itself.
    [result] = run_as_worker(program, tmp_path / "out", [job], spy_log=log,
                             environment={"MINIFY_CACHE_DIR": str(caches)})

    assert result["sandbox_start"] == "spawn"
    forbidden, _ = spied_calls(log)
    assert forbidden == []


def test_a_forked_sandbox_that_cannot_use_cuda_is_replaced_by_a_spawned_one(
        preloaded_worker: tuple[list[dict[str, object]], Path]) -> None:
    results, log = preloaded_worker
    result = results[POISONED_JOB]

    assert result["status"] == "succeeded", result["reason"]
    assert ops_of(result["graph_code"]) == ["relu"]  # type: ignore[arg-type]
    assert result["signature"] == "RuntimeError: injected failure on relu"
    assert result["sandbox_start"] == "spawn"  # the server the result came from, not the first
    forbidden, _ = spied_calls(log, POISONED_JOB)
    assert forbidden == []  # nor does the spawned server that replaced it


def test_a_sandbox_fault_a_fresh_sandbox_has_too_fails_the_job_with_its_cause(
        chain_pt2: Path, tmp_path: Path) -> None:
    # One fresh (spawned) sandbox that faults too is the claim, and the job's end: a second
    # spawned server would initialize CUDA as the first did (test_evaluator.py: when to restart).
    result = minify(chain_pt2, spec(f"{PREFIX}:cuda_fork_error_always"), tmp_path / "out")

    assert result.status is JobState.failed
    assert "Cannot re-initialize CUDA in forked subprocess" in (result.reason or "")
    assert "a sandbox spawned afresh met it too, after 1 sandbox restart" in (result.reason or "")
    assert result.report.signature is None and result.report.nodes_final is None


def test_a_failure_that_does_not_depend_on_the_program_fails_the_job(chain_pt2: Path, tmp_path: Path) -> None:
    result = minify(chain_pt2, spec(f"{PREFIX}:fail_always"), tmp_path / "out")

    assert result.status is JobState.failed
    assert result.reason is not None
    assert result.reason.startswith("the failure does not depend on the program: an empty graph")
    assert "RuntimeError: injected failure on every graph" in result.reason
    assert "minimized.pt2" not in result.artifacts


@pytest.fixture(scope="module")
def failed_import_job(chain_pt2: Path, tmp_path_factory: pytest.TempPathFactory) -> MinifyResult:
    """The chain minimized once with `failed_import_on_relu` (inductor's form of a failed import of
    generated code), its failure matched by a middle link of the chain ("Failed to import"), for
    the signature it records, the repro that prints it and the match: one job for the three."""
    job = spec(f"{PREFIX}:failed_import_on_relu", failure={"kind": "compile_error", "match": "Failed to import"})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ALLOWED_BACKENDS_ENV, PREFIX)
        return minify(chain_pt2, job, tmp_path_factory.mktemp("failed-import"))


def test_the_signature_names_the_root_cause_and_keeps_the_chain(failed_import_job: MinifyResult) -> None:
    result = failed_import_job

    assert result.status is JobState.succeeded
    assert result.report.signature == "SyntaxError: invalid syntax (<hash>.py, line N)"
    assert [link.split(":")[0] for link in result.report.signature_chain] == \
        ["InductorError", "RuntimeError", "SyntaxError"]
    assert result.report.signature_chain[1].startswith("RuntimeError: Failed to import /tmp/")


def test_match_sees_every_link_of_the_chain(failed_import_job: MinifyResult) -> None:
    result = failed_import_job  # its failure matched by "Failed to import", not in the root cause

    assert result.status is JobState.succeeded
    assert ops_of(result.report.graph_code) == ["relu"]


def test_the_repro_prints_the_signature_the_report_records(failed_import_job: MinifyResult) -> None:
    result = failed_import_job

    run = run_repro(result.artifacts["repro.py"])

    assert run.returncode == 1
    assert f"repro failed with: {result.report.signature}\n" in run.stderr
