"""Custom ops (`torch.library`): the capture records the modules that register them, the worker
imports those its operator allows before it loads anything, and repro.py imports them too.

The ops are tests/support/custom_ops.py's (`minify_test::scale`, `minify_test::shift`); the backends
are cheap (tests/support/backends.py's factories), so no test compiles anything.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from minify_client.capture import capture_failures
from minify_client.capture.custom_ops import CustomOp, custom_ops, op_modules
from minify_contract.models import JobSpec, JobState
from minify_contract.specflags import add_spec_arguments, spec_from_args
from minify_worker.engine import minify
from minify_worker.programs.fx.backends import ALLOWED_BACKENDS_ENV
from minify_worker.programs.fx.op_modules import ALLOWED_OP_MODULES_ENV
from tests.support import custom_ops as test_ops
from tests.support.backends import ALLOWED, PREFIX
from tests.support.repro import run_repro

OPS = test_ops.PREFIX


def ops_called(code: str | None) -> list[str]:
    """The ops a graph's printed code calls, any namespace: "scale" for `torch.ops.minify_test.scale.default`."""
    return re.findall(r"torch\.ops\.\w+\.(\w+)\.\w+\(", code or "")


def save_scale_relu(directory: Path) -> Path:
    """sin -> scale -> cos -> relu, exported and saved: it loads only where the op is registered."""
    path = directory / "scale_relu.pt2"
    torch.export.save(torch.export.export(test_ops.ScaleRelu(), (torch.randn(4, 4),)), path)
    return path


def job_spec(backend: str, **fields: object) -> JobSpec:
    return JobSpec.model_validate({"backend": backend, "op_modules": [OPS], "culprit": False, "shrink": False,
                                   "limits": {"candidate_timeout_s": 10, "parallelism": 2}, **fields})


# -- the worker ------------------------------------------------------------------------------


def test_the_offline_command_minifies_a_program_with_a_custom_op_to_the_relu_where_its_module_is_allowed(
        tmp_path: Path) -> None:
    # A fresh worker process: the program loads (in a sandbox child), its graph is rebuilt (in the
    # engine) and its candidates run only because the engine and the fork server import the spec's
    # op module (long-lived children are forked from that server too: no test of their own).
    program = save_scale_relu(tmp_path)
    env = {**os.environ, **ALLOWED, ALLOWED_OP_MODULES_ENV: OPS}

    done = subprocess.run([sys.executable, "-m", "minify_worker.cli", "minify", str(program),
                           "--backend", f"{PREFIX}:fail_on_relu", "--op-module", OPS, "--no-shrink", "--no-culprit",
                           "--out", str(tmp_path / "out"), "--json"],
                          capture_output=True, text=True, timeout=300, env=env)

    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert ops_called(report["graph_code"]) == ["relu"]
    assert report["nodes_original"] == 4


@pytest.fixture(scope="module")
def bug_in_the_op(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str | None]:
    """A job on sin -> scale -> cos -> relu whose backend fails on the custom op: its out dir and graph code."""
    directory = tmp_path_factory.mktemp("bug_in_the_op")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ALLOWED_BACKENDS_ENV, OPS)
        patch.setenv(ALLOWED_OP_MODULES_ENV, OPS)
        result = minify(save_scale_relu(directory), job_spec(f"{OPS}:fail_on_scale"), directory / "out")
    assert result.status is JobState.succeeded, result.reason
    return directory / "out", result.report.graph_code


def test_a_bug_in_the_custom_op_keeps_the_op(bug_in_the_op: tuple[Path, str | None]) -> None:
    _, graph_code = bug_in_the_op

    assert ops_called(graph_code) == ["scale"]


def test_the_repro_imports_the_op_module_and_reproduces(bug_in_the_op: tuple[Path, str | None]) -> None:
    out, _ = bug_in_the_op
    assert f"\nimport {OPS}\n" in (out / "repro.py").read_text()

    ran = run_repro(out / "repro.py", timeout_s=120)

    assert ran.returncode != 0
    assert "repro failed with: RuntimeError: injected failure on scale" in ran.stderr


def test_the_minimized_program_loads_where_the_op_module_is_imported(bug_in_the_op: tuple[Path, str | None]) -> None:
    out, _ = bug_in_the_op

    program = torch.export.load(out / "minimized.pt2")  # this process imported tests.support.custom_ops

    (scaled,) = program.module()(torch.ones(4, 4))
    assert torch.equal(scaled, torch.full((4, 4), 2.0))
    assert [str(node.target) for node in program.graph.nodes if node.op == "call_function"] == \
        ["minify_test.scale.default"]


def test_a_job_whose_op_module_the_worker_does_not_allow_fails_at_once_saying_how_to_allow_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, test_backends_allowed: None) -> None:
    monkeypatch.delenv(ALLOWED_OP_MODULES_ENV, raising=False)
    started = time.monotonic()

    result = minify(save_scale_relu(tmp_path), job_spec(f"{PREFIX}:fail_on_relu"), tmp_path / "out")

    assert result.status is JobState.failed
    assert time.monotonic() - started < 30
    assert result.reason is not None
    assert f"module {OPS!r}" in result.reason and "minify_test::scale" in result.reason
    assert f"{ALLOWED_OP_MODULES_ENV}={OPS}" in result.reason
    assert "install" in result.reason


def test_a_job_whose_op_module_does_not_import_fails_at_once_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, test_backends_allowed: None) -> None:
    monkeypatch.setenv(ALLOWED_OP_MODULES_ENV, "tests.support")

    result = minify(save_scale_relu(tmp_path), job_spec(f"{PREFIX}:fail_on_relu", op_modules=["tests.support.gone"]),
                    tmp_path / "out")

    assert result.status is JobState.failed
    assert result.reason is not None
    assert "module 'tests.support.gone'" in result.reason and "cannot be imported on this worker" in result.reason
    assert "ModuleNotFoundError" in result.reason


# -- the spec --------------------------------------------------------------------------------


def test_the_op_module_flag_adds_modules_to_those_of_the_spec_file(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_spec_arguments(parser)
    (tmp_path / "spec.json").write_text(json.dumps({"op_modules": ["captured.ops"]}))

    spec = spec_from_args(parser.parse_args(["--spec", str(tmp_path / "spec.json"),
                                             "--op-module", "mylib.ops", "--op-module", "other"]))

    assert spec.op_modules == ["captured.ops", "mylib.ops", "other"]


def test_an_op_module_must_be_a_dotted_module_name() -> None:
    with pytest.raises(ValueError, match="not a dotted Python module name"):
        JobSpec.model_validate({"op_modules": ["mylib/ops.py"]})


# -- the capture -----------------------------------------------------------------------------


def broken_backend(gm: torch.fx.GraphModule, example_inputs: list) -> None:
    raise RuntimeError("the compiler crashed")


def test_a_capture_records_the_module_that_registers_the_graphs_custom_op_in_the_spec(tmp_path: Path) -> None:
    model, x = test_ops.ScaleRelu(), torch.randn(3)

    with pytest.raises(RuntimeError), capture_failures(model, (x,), save_to=tmp_path / "capture"):
        torch._dynamo.reset()
        torch.compile(model, backend=broken_backend)(x)

    spec = JobSpec.model_validate_json((tmp_path / "capture" / "spec.json").read_text())
    assert spec.op_modules == [OPS]


def test_custom_ops_are_found_with_their_namespace_and_module_however_they_were_defined() -> None:
    class ScaleShift(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.minify_test.shift(test_ops.scale(torch.relu(x), 2.0))

    program = torch.export.export(ScaleShift(), (torch.randn(3),))

    found = custom_ops(program)

    assert found == [CustomOp("minify_test::scale", OPS), CustomOp("minify_test::shift", OPS)]
    assert {op.namespace for op in found} == {"minify_test"}


@torch.library.custom_op("minify_test::negate_here", mutates_args=())
def negate_here(x: torch.Tensor) -> torch.Tensor:
    return -x


negate_here.register_fake(lambda x: torch.empty_like(x))


def test_an_op_registered_in_a_test_file_is_recorded_with_a_warning_that_the_worker_needs_it(
        caplog: pytest.LogCaptureFixture) -> None:
    class Negate(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return negate_here(x)

    program = torch.export.export(Negate(), (torch.randn(3),))

    with caplog.at_level(logging.WARNING):
        recorded = op_modules(program)

    assert recorded == [__name__]
    assert "minify_test::negate_here" in caplog.text and "the test file" in caplog.text
    assert "worker will need to import" in caplog.text
