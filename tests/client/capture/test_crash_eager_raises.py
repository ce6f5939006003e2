"""A crash whose program raises eagerly (pytorch#126691): eager raises a clean error (an index out
of bounds), the compiled program kills the process. That is a compiler bug, keyed by the death: the
worker prepares the program with eager's values up to the op that raises, judges candidates by the
signal, and repro.py says what eager raises (and passes once the compiled program raises too). A
program that raises both ways is its own error, never filed as a bug.

The family: indexing ops given an out-of-range index (a tensor index, index_select, gather,
embedding, take), each between other ops. Cheap runs use a test backend whose compiled code aborts
where the graph raises (tests/support/dying_backends.py); the last test is inductor's own abort,
captured by the runner from a script.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from minify_contract.models import JobSpec, JobState
from minify_worker.engine import minify
from minify_worker.programs.fx.backends import ALLOWED_BACKENDS_ENV
from tests.support.graphs import ops_of
from tests.support.repro import Repros, run_repro
from tests.support.subprocesses import run_clean

REPO = Path(__file__).resolve().parents[3]
ABORTS = "tests.support.dying_backends:abort_where_eager_raises"


def _index(y: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return y[index]


def _gather(y: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return torch.gather(y, 0, index.unsqueeze(1).expand(-1, y.shape[1]))


# Each: the indexing op, and the aten op the minimal program should be.
FAMILY: dict[str, tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], str]] = {
    "tensor index": (_index, "index"),
    "index_select": (lambda y, index: torch.index_select(y, 0, index), "index_select"),
    "gather": (_gather, "gather"),
    "embedding": (lambda y, index: torch.nn.functional.embedding(index, y), "embedding"),
    "take": (lambda y, index: torch.take(y, index), "take"),
}


class Indexing(torch.nn.Module):
    def __init__(self, op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.op = op

    def forward(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.op(torch.relu(x) * 2, index)) + 1


def _program(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """The family member `name` exported with in-range indices, saved with out-of-range ones."""
    module = Indexing(FAMILY[name][0])
    x = torch.randn(8, 4)
    torch.export.save(torch.export.export(module, (x, torch.tensor([0, 1, 2]))), tmp_path / "program.pt2")
    torch.save(((x, torch.tensor([1, 40, 2])), {}), tmp_path / "inputs.pt")
    return tmp_path / "program.pt2", tmp_path / "inputs.pt"


def _minify(tmp_path: Path, name: str, backend: str) -> Any:
    program, inputs = _program(tmp_path, name)
    spec = JobSpec.model_validate({"backend": backend, "failure": {"kind": "crash", "signature": "SIGABRT"},
                                   "culprit": False, "versions": False, "shrink": False})
    return minify(program, spec, tmp_path / "out", inputs=inputs)


@pytest.fixture(scope="module")
def aborting_job(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Any, Path]]:
    """The family member's job under the aborting backend, and its output folder: run once for the
    module, so the fixed-compiler test reads index_select's repro.py instead of minimizing it again
    (tests/conftest.py keeps the module on one xdist worker)."""
    jobs: dict[str, tuple[Any, Path]] = {}

    def job(name: str) -> tuple[Any, Path]:
        if name not in jobs:
            directory = tmp_path_factory.mktemp(name.replace(" ", "_"))
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv(ALLOWED_BACKENDS_ENV, "tests.support")
                jobs[name] = (_minify(directory, name, ABORTS), directory / "out")
        return jobs[name]

    return job


@pytest.fixture(scope="module")
def repros() -> Repros:
    """The aborting jobs' repro.py files, each run as `python repro.py` in a fork of the test
    process's one interpreter that imported torch (tests/support/repro.py), instead of one
    interpreter importing torch per repro, with the backends of tests.support allowed."""
    return Repros(**{ALLOWED_BACKENDS_ENV: "tests.support"})


@pytest.mark.parametrize("name", list(FAMILY))
def test_a_compiled_program_that_dies_where_eager_raises_minimizes_to_the_op_that_raises(
        aborting_job: Callable[[str], tuple[Any, Path]], repros: Repros, name: str) -> None:
    done, out = aborting_job(name)
    assert done.status is JobState.succeeded, done.reason
    report = json.loads((out / "report.json").read_text())
    assert report["signature"] == "SIGABRT"
    assert ops_of(report["graph_code"]) == [FAMILY[name][1]]
    repro = (out / "repro.py").read_text()
    assert "# Eager raises:" in repro and "out of" in repro.split("# Eager raises:")[1].splitlines()[0]
    ran = repros.run(out / "repro.py")
    assert ran.returncode == -signal.SIGABRT, ran.stderr[-2000:]


def test_the_repro_passes_once_the_compiled_program_raises_as_eager_does(
        tmp_path: Path, aborting_job: Callable[[str], tuple[Any, Path]], repros: Repros) -> None:
    """The fixed compiler, as the version phase would run it: the same repro.py under the eager
    backend, which raises eager's error, exits 0 (a copy of the job's folder, edited)."""
    done, out = aborting_job("index_select")
    assert done.status is JobState.succeeded, done.reason
    shutil.copytree(out, tmp_path / "out")
    repro = tmp_path / "out" / "repro.py"
    repro.write_text(repro.read_text().replace(f"BACKEND = {ABORTS!r}", "BACKEND = 'eager'").replace(
        "from tests.support.dying_backends import abort_where_eager_raises", "").replace(
        "abort_where_eager_raises(gm, inputs)", "torch._dynamo.lookup_backend('eager')(gm, inputs)"))
    ran = repros.run(repro)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "repro passed: the compiled program raises as eager does: IndexError" in ran.stdout


def test_a_program_that_raises_compiled_as_it_does_eagerly_is_its_own_error(tmp_path: Path) -> None:
    """The same programs under a compiler that raises eager's error (the eager backend): no crash,
    no compiler bug; the job fails saying the program's own error."""
    done = _minify(tmp_path, "gather", "eager")
    assert done.status is JobState.failed, done.reason
    assert "raises when run eagerly, and the compiled program raises too" in (done.reason or "")
    assert "its own error" in (done.reason or "")


@pytest.mark.inductor
def test_inductors_abort_in_a_parallel_bounds_check_is_captured_and_minimized(tmp_path: Path) -> None:
    """pytorch#126691's class with gather: inductor's C++ bounds check throws inside an OpenMP region
    and the process aborts; eager raises. The capture records the compile's thread count
    (`cpp.threads`: the sandbox's children run one thread, where the kernel has no parallel region
    and raises instead) and the job minimizes it to the gather."""
    (tmp_path / "script.py").write_text(textwrap.dedent("""
        import torch
        torch.set_num_threads(2)
        def gather_rows(x):
            index = torch.arange(x.shape[1] + 5).expand(x.shape[0], -1)
            return torch.gather(torch.relu(x), 1, index) * 2
        torch.compile(gather_rows)(torch.rand(1024, 128))
    """))
    captured = run_clean([sys.executable, "-m", "minify_client.capture", "--crash", "--dir", "caps", "script.py"],
                         tmp_path, timeout_s=600)
    assert captured.returncode == -signal.SIGABRT, captured.stderr[-3000:]
    (entry,) = json.loads((tmp_path / "caps" / "captures.json").read_text())["captures"]
    spec = JobSpec.model_validate_json((tmp_path / "caps" / entry["spec"]).read_text())
    assert (spec.failure.kind, spec.failure.signature, spec.config) == ("crash", "SIGABRT", {"cpp.threads": 2})
    # The inputs' shrink left out, as in every job of this module (tests/worker/programs/fx/test_shrink.py has it).
    done = minify(tmp_path / "caps" / entry["program"],
                  spec.model_copy(update={"culprit": False, "versions": False, "shrink": False}),
                  tmp_path / "out", inputs=tmp_path / "caps" / entry["inputs"])
    assert done.status is JobState.succeeded, done.reason
    assert ops_of(json.loads((tmp_path / "out" / "report.json").read_text())["graph_code"]) == ["gather"]
    ran = run_repro(tmp_path / "out" / "repro.py")
    assert ran.returncode == -signal.SIGABRT, ran.stderr[-2000:]
