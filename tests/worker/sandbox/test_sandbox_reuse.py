"""Long-lived sandbox children (reuse): many candidates per child, and still no candidate's crash or
leftover state decides another candidate's outcome (issue 13; docs/isolation.md, "Long-lived children")."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from minify_contract.models import JobSpec, JobState
from minify_worker.engine import minify
from minify_worker.outcomes import Crashed, Fails, Passes, TimedOut
from minify_worker.programs.fx.graph import graph_to_wire
from minify_worker.sandbox import SandboxPool
from tests.support.backends import ALLOWED, PREFIX
from tests.support.graphs import chain_graph, save_chain
from tests.support.repro import run_repro


def chain(*ops: str) -> dict:
    return graph_to_wire(chain_graph(*ops))


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxPool]:
    workdir = tmp_path_factory.mktemp("reuse")
    torch.save({"x": torch.randn(4, 4)}, workdir / "values.pt")
    spec = JobSpec(backend=f"{PREFIX}:misbehave_by_op")
    with SandboxPool(workdir, workdir / "values.pt", spec, parallelism=1, reuse=10,
                     env=ALLOWED) as sandbox:
        yield sandbox


def run(pool: SandboxPool, *ops: str, timeout_s: float = 60) -> tuple[object, int | None]:
    future = pool.submit(chain(*ops), timeout_s=timeout_s)
    outcome = future.result()
    return outcome, pool.child_pid(future)


def test_a_long_lived_child_runs_one_candidate_after_another(pool: SandboxPool) -> None:
    pids = {run(pool, op)[1] for op in ("abs", "floor", "abs", "ceil", "abs")}
    assert len(pids) == 1


def test_a_crash_is_confirmed_in_a_fresh_child_and_costs_only_the_children_it_killed(pool: SandboxPool) -> None:
    _, before = run(pool, "abs")
    crashed, crashed_in = run(pool, "sin")  # kills `before`, then runs again in a fresh child
    passed, after = run(pool, "abs")

    assert isinstance(crashed, Crashed) and crashed.signal == signal.SIGSEGV
    assert isinstance(passed, Passes)
    assert len({before, crashed_in, after}) == 3


def test_a_hang_costs_its_child_only(pool: SandboxPool) -> None:
    hung, hung_in = run(pool, "tanh", timeout_s=2)
    passed, after = run(pool, "abs")

    assert isinstance(hung, TimedOut) and isinstance(passed, Passes)
    assert after != hung_in


def test_a_failure_in_a_child_that_ran_candidates_before_is_confirmed_in_a_fresh_one(pool: SandboxPool) -> None:
    _, warm = run(pool, "abs")
    failed, confirmed_in = run(pool, "relu")

    assert isinstance(failed, Fails) and failed.signature.key == "injected failure on relu"
    assert confirmed_in != warm


# The jobs below are about the reduction in reused children: the phases after minimality (shrink,
# culprit), tested in their own modules, are left out.
REDUCTION_ONLY = {"shrink": False, "culprit": False}


@pytest.fixture
def chain_pt2(tmp_path: Path) -> Path:
    return save_chain(tmp_path, ("sin", "sigmoid", "cos", "relu", "tanh"))


def test_state_one_candidate_leaves_in_a_reused_child_never_decides_another(
        chain_pt2: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, test_backends_allowed: None) -> None:
    # In a fresh process only relu and sigmoid together fail; in a reused child relu alone fails
    # after any candidate with a sigmoid. The job must end with both, and so must its repro.
    monkeypatch.setenv("MINIFY_SANDBOX_REUSE", "50")
    job = JobSpec.model_validate({**REDUCTION_ONLY, "backend": f"{PREFIX}:relu_fails_after_sigmoid",
                                  "limits": {"candidate_timeout_s": 30, "parallelism": 2}})

    result = minify(chain_pt2, job, tmp_path / "out")

    assert result.status is JobState.succeeded, result.reason
    assert result.reason is None
    code = result.report.graph_code or ""
    assert "aten.sigmoid" in code and "aten.relu" in code
    repro = run_repro(tmp_path / "out" / "repro.py")
    assert repro.returncode == 1
    assert "repro failed with: RuntimeError: injected failure on relu after a sigmoid" in repro.stderr


def test_a_job_with_reused_children_ends_on_the_failing_op(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            test_backends_allowed: None) -> None:
    monkeypatch.setenv("MINIFY_SANDBOX_REUSE", "50")
    save_chain(tmp_path, ("sin", "cos", "exp", "relu", "tanh", "neg", "abs", "sigmoid"))
    job = JobSpec.model_validate({**REDUCTION_ONLY, "backend": f"{PREFIX}:fail_on_relu",
                                  "limits": {"candidate_timeout_s": 30, "parallelism": 2}})

    result = minify(tmp_path / "chain.pt2", job, tmp_path / "out")

    assert result.status is JobState.succeeded, result.reason
    assert result.report.nodes_final == 1 and "aten.relu" in (result.report.graph_code or "")
