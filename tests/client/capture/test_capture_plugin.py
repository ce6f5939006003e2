"""Capture with no code change: a sample test suite (tests/capture_suite) run by a real pytest with
minify's plugin on, every failing compile in it captured once per bug, each capture minimized by
the offline engine to the relu that breaks the compiler.

The suite runs once per module (inductor compiles cost seconds each); the tests read its outcomes
(junit XML), its capture directory and the engine's reports (the engine in this process, each
capture minimized once, when a test first asks for it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from minify_contract.models import JobSpec
from minify_worker.engine import minify
from minify_worker.programs.fx.backends import ALLOWED_BACKENDS_ENV
from tests.support.backends import PREFIX
from tests.support.graphs import ops_of

REPO = Path(__file__).resolve().parents[3]
SUITE = REPO / "tests" / "capture_suite"
RELU_BUG = re.compile(r"^CppCompileError: .compile. was not declared in this scope$")  # g++'s quotes follow the locale

# The module's first test carries the sample suite's run (seven bugs, BERT among them, under inductor):
# about 5 min on a 2-core box at CI's load, past the default 600 s when the box is loaded 10x (seen:
# every test of the module errored at setup). The bound stays, doubled.
pytestmark = [pytest.mark.inductor, pytest.mark.timeout(1200)]


@dataclass
class SuiteRun:
    returncode: int
    output: str
    outcomes: dict[str, str]  # test id -> passed / failed
    reports: dict[str, str]  # test id -> the failure's text, as pytest reports it
    directory: Path
    captures: dict[str, dict]  # the test id that first hit a bug -> its captures.json entry


def _environment(**extra: str) -> dict[str, str]:
    environment = {key: value for key, value in os.environ.items()
                   if not key.startswith(("MINIFY_", "PYTEST_"))}
    environment["PYTHONPATH"] = str(REPO)
    environment.update(extra)
    return environment


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> SuiteRun:
    """The sample suite under the plugin, run once for the module."""
    work = tmp_path_factory.mktemp("suite")
    directory, junit = work / "captures", work / "junit.xml"
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(SUITE / "suite.ini"), str(SUITE), "-q", f"--junitxml={junit}"],
        cwd=REPO, capture_output=True, text=True,  # bounded by the test's timeout (pytest-timeout)
        env=_environment(MINIFY_CAPTURE_DIR=str(directory), MINIFY_CAPTURE_ACCURACY="1"))
    outcomes, reports = {}, {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        test_id = f"{case.get('classname', '').rsplit('.', 1)[-1]}.py::{case.get('name')}"
        failure = case.find("failure")
        outcomes[test_id] = "failed" if failure is not None else "passed"
        reports[test_id] = (failure.text or "") if failure is not None else ""
    manifest = json.loads((directory / "captures.json").read_text())["captures"]
    captures = {entry["tests"][0]: entry for entry in manifest}
    return SuiteRun(ran.returncode, ran.stdout + ran.stderr, outcomes, reports, directory, captures)


def _capture(suite: SuiteRun, test_id: str) -> dict:
    assert test_id in suite.captures, f"no capture first hit by {test_id}: {sorted(suite.captures)}"
    return suite.captures[test_id]


def _program(suite: SuiteRun, entry: dict) -> torch.export.ExportedProgram:
    return torch.export.load(suite.directory / entry["program"])


def _spec(suite: SuiteRun, entry: dict) -> dict:
    return json.loads((suite.directory / entry["spec"]).read_text())


GRAPH_BREAKS = "case_graph_breaks.py::test_graph_breaks_model_compiles"
BLOCK = "case_graph_breaks.py::test_graph_breaks_model_in_a_capture_block"
BERT = "case_transformer.py::test_bert_compiles"
AOTI = "case_aoti.py::test_aoti_package_builds"
ACCURACY = "case_accuracy.py::test_wrong_values_go_unnoticed_by_the_test"
ONE_BUG = [f"case_one_bug.py::test_same_bug[{seed}]" for seed in range(10)]
TRAINING = "case_training.py::test_training_step"
DYNAMIC = "case_dynamic.py::test_dynamic_model_compiles"
PASSING = "case_passing.py::test_inductor_compile_matches_eager"
OWN_ASSERTION = "case_passing.py::test_a_failing_assertion_stays_the_tests_own"


def test_every_test_keeps_its_outcome(suite: SuiteRun):
    failing = {GRAPH_BREAKS, BLOCK, BERT, AOTI, *ONE_BUG, TRAINING, DYNAMIC, OWN_ASSERTION}
    assert suite.outcomes == {test_id: "failed" if test_id in failing else "passed"
                              for test_id in [*failing, ACCURACY, PASSING]}, suite.output[-3000:]
    assert suite.returncode == 1


def test_a_failing_test_keeps_its_error_with_a_note_on_where_its_capture_went(suite: SuiteRun):
    report = suite.reports[GRAPH_BREAKS]
    assert "InductorError" in report and "CppCompileError" in report
    entry = _capture(suite, GRAPH_BREAKS)
    assert RELU_BUG.match(entry["signature"])
    where = suite.directory / entry["name"]
    assert f"minify: captured the failing dynamo graph ({entry['signature']}) in {where}" in report
    assert f"minify-client submit-captures {suite.directory}" in report


def test_passing_compiles_and_the_tests_own_failures_capture_nothing(suite: SuiteRun):
    hit = {test_id for entry in suite.captures.values() for test_id in entry["tests"]}
    assert PASSING not in hit and OWN_ASSERTION not in hit
    assert "AssertionError: the test's own assertion" in suite.reports[OWN_ASSERTION]
    assert "minify" not in suite.reports[OWN_ASSERTION]


def test_with_graph_breaks_only_the_graph_that_failed_is_captured(suite: SuiteRun):
    entry = _capture(suite, GRAPH_BREAKS)
    assert entry["level"] == "dynamo" and RELU_BUG.match(entry["signature"])
    assert ops_of(_program(suite, entry).graph) == ["relu", "cos"]  # not the linear of the first graph
    args, kwargs = torch.load(suite.directory / entry["inputs"], weights_only=True)
    assert [arg.shape for arg in args] == [(4, 8)] and kwargs == {}


def test_the_spec_records_the_backend_the_settings_and_the_signature(suite: SuiteRun):
    spec = _spec(suite, _capture(suite, GRAPH_BREAKS))
    assert spec["backend"] == "inductor"
    assert spec["config"] == {"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}
    assert spec["failure"]["kind"] == "compile_error" and RELU_BUG.match(spec["failure"]["signature"])


def test_capture_failures_takes_the_failing_graph_too(suite: SuiteRun):
    program = torch.export.load(suite.directory / "block" / "GraphBreaks.pt2")
    assert ops_of(program.graph) == ["relu", "cos"]
    # The plugin saw the same bug again: one capture, both tests listed.
    assert _capture(suite, GRAPH_BREAKS)["tests"] == [GRAPH_BREAKS, BLOCK]


def test_ten_tests_that_hit_one_bug_are_captured_once_with_every_test_id(suite: SuiteRun):
    entry = _capture(suite, ONE_BUG[0])
    assert entry["tests"] == ONE_BUG
    assert [entry for entry in suite.captures.values() if "one_bug" in entry["name"]] == [entry]
    assert _spec(suite, entry)["backend"] == "tests.support.backends:fail_on_relu"
    for test_id in ONE_BUG[1:]:
        assert f"(first hit by {ONE_BUG[0]})" in suite.reports[test_id]


def test_a_real_architecture_is_captured(suite: SuiteRun):
    entry = _capture(suite, BERT)
    ops = ops_of(_program(suite, entry).graph)
    assert RELU_BUG.match(entry["signature"]) and "relu" in ops and len(ops) > 20


def test_a_failing_aoti_build_captures_its_exported_program(suite: SuiteRun):
    entry = _capture(suite, AOTI)
    spec = _spec(suite, entry)
    assert entry["level"] == "aoti" and spec["backend"] == "aot_inductor"
    assert spec["config"] == {"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}
    program = _program(suite, entry)
    assert ops_of(program.graph) == ["relu", "cos"]
    assert list(program.graph_signature.user_inputs) == ["input"]  # nn.Sequential's argument, a builtin's name


def test_a_dynamic_compile_is_captured_with_its_symbolic_dims(suite: SuiteRun):
    entry = _capture(suite, DYNAMIC)
    program = _program(suite, entry)
    assert RELU_BUG.match(entry["signature"]) and "relu" in ops_of(program.graph)
    assert program.range_constraints, "the captured program lost its dynamic dims"
    sizes = [node.meta["val"].shape for node in program.graph.nodes if node.op == "placeholder"]
    assert any(isinstance(size, torch.SymInt) for shape in sizes for size in shape), sizes


def test_an_accuracy_mismatch_is_captured_when_asked(suite: SuiteRun):
    entry = _capture(suite, ACCURACY)
    spec = _spec(suite, entry)
    assert entry["kind"] == "accuracy" and spec["failure"]["kind"] == "accuracy"
    assert spec["failure"]["signature"] == "AccuracyError"
    assert spec["config"] == {"cpp.inject_relu_bug_TESTING_ONLY": "accuracy"}


def test_a_backward_compile_failure_is_captured_as_the_backward_graph(suite: SuiteRun):
    entry = _capture(suite, TRAINING)
    assert entry["level"] == "aot (backward)" and RELU_BUG.match(entry["signature"])
    program = _program(suite, entry)
    placeholders = [node.name for node in program.graph.nodes if node.op == "placeholder"]
    assert any(name.startswith("tangents") for name in placeholders), placeholders
    assert "relu" in ops_of(program.graph) and "mm" in ops_of(program.graph)


# The real architecture's capture goes to the engine with the test backend that fails on relu in
# place of inductor: what it proves is that the capture of a real model (its program and inputs) is
# whole, loads and reduces to the relu. That the recorded spec (backend inductor and its relu-bug
# setting) replays under real inductor is proven by the graph-break capture's minimization, which
# records its spec the same way (a dynamo-level inductor capture); BERT's more than 20 nodes under inductor
# cost dozens of g++ compiles.
# The AOTI capture too: its spec (aot_inductor, the relu-bug setting) is checked above
# (test_a_failing_aoti_build_captures_its_exported_program), and that spec minimizing to the relu
# under real aot_inductor is test_engine_inductor.py's AOTI job (same backend, same setting); here
# the capture's exported program (its `input` argument) loads and reduces to the relu. Under
# aot_inductor each candidate is a package build and a g++ link (20-30 s of CPU each).
CHEAP_BACKEND = {BERT, AOTI}


@pytest.fixture(scope="module")
def minimized(suite: SuiteRun) -> Iterator[Callable[[str], dict]]:
    """A capture's report.json from the offline engine, by the test id that first hit it: the
    engine run in this process, as the RQ worker runs it (preloaded: its sandboxes fork from here),
    once per capture, on the spec the capture wrote (the culprit and shrink phases, which come after
    minimality, left out: not what is checked)."""
    reports: dict[str, dict] = {}
    work = suite.directory.parent / "minimized"

    def report(test_id: str) -> dict:
        entry = _capture(suite, test_id)
        if entry["name"] not in reports:
            spec = {**_spec(suite, entry), "culprit": False, "shrink": False}
            if test_id in CHEAP_BACKEND:
                spec = {**spec, "backend": f"{PREFIX}:fail_on_relu", "config": {}, "failure": {"kind": "compile_error"}}
            out = work / entry["name"]
            minify(suite.directory / entry["program"], JobSpec.model_validate(spec), out,
                   inputs=suite.directory / entry["inputs"])
            reports[entry["name"]] = {**json.loads((out / "report.json").read_text()), "out": str(out)}
        return reports[entry["name"]]

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ALLOWED_BACKENDS_ENV, PREFIX)
        yield report


@pytest.mark.parametrize("test_id", [GRAPH_BREAKS, BERT, AOTI, ACCURACY, ONE_BUG[0], TRAINING, DYNAMIC])
def test_each_capture_minimizes_to_the_relu(minimized: Callable[[str], dict], test_id: str):
    """Each kind of capture (dynamo level, a real architecture, AOTI, accuracy, a custom backend, a
    backward graph, dynamic shapes) is a whole repro the engine reduces to the relu: under the
    backend and settings its spec recorded, but for BERT's and AOTI's (see CHEAP_BACKEND)."""
    report = minimized(test_id)
    assert report["status"] == "succeeded", str(report)[-3000:]
    assert report["nodes_final"] == 1
    assert ops_of(torch.export.load(Path(report["out"]) / "minimized.pt2").graph) == ["relu"]


def test_a_dynamic_capture_minimizes_to_a_dynamic_relu(minimized: Callable[[str], dict]):
    report = minimized(DYNAMIC)
    assert torch.export.load(Path(report["out"]) / "minimized.pt2").range_constraints, str(report)[-3000:]


def test_the_plugin_module_imports_nothing_until_capture_is_on():
    code = ("import sys, _minify_pytestplugin as plugin\n"
            "assert not plugin.capture_requested()\n"
            "print(sorted(name for name in sys.modules if name.split('.')[0] in ('torch', 'minify_client')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=_environment())
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


FAILING_SCRIPT = """
import sys
import torch
from tests.support.backends import fail_on_relu

print("argv", sys.argv[1:])
model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
torch.compile(model, backend=fail_on_relu)(torch.randn(2, 3))
"""


def test_the_script_runner_runs_the_script_as_main_and_captures_its_failing_graph(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(FAILING_SCRIPT)
    ran = subprocess.run([sys.executable, "-m", "minify_client.capture", "--dir", str(tmp_path / "captures"),
                          str(script), "--epochs", "1"], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env=_environment())
    assert ran.returncode == 1, ran.stderr[-3000:]
    assert "argv ['--epochs', '1']" in ran.stdout
    assert "RuntimeError: injected failure on relu" in ran.stderr
    assert "minify: captured the failing dynamo graph (RuntimeError: injected failure on relu)" in ran.stderr
    (entry,) = json.loads((tmp_path / "captures" / "captures.json").read_text())["captures"]
    assert entry["name"] == "train.py" and entry["tests"] == ["train.py"]
    program = torch.export.load(tmp_path / "captures" / entry["program"])
    assert ops_of(program.graph) == ["linear", "relu"]


def test_the_script_runner_keeps_the_scripts_exit_code(tmp_path: Path):
    script = tmp_path / "done.py"
    script.write_text("import sys\nsys.exit(7)\n")
    ran = subprocess.run([sys.executable, "-m", "minify_client.capture", "--dir", str(tmp_path / "c"), str(script)],
                         cwd=REPO, capture_output=True, text=True, timeout=300, env=_environment())
    assert ran.returncode == 7, ran.stderr[-2000:]
    assert not (tmp_path / "c" / "captures.json").exists()


def test_dash_p_switches_the_plugin_on_without_the_environment(tmp_path: Path):
    (tmp_path / "test_relu.py").write_text(textwrap.dedent("""
        import torch
        from tests.support.backends import fail_on_relu


        def test_relu():
            torch.compile(torch.nn.ReLU(), backend=fail_on_relu)(torch.randn(4))
    """))
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                          "minify_client.pytest_plugin", "test_relu.py"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300, env=_environment())
    assert ran.returncode == 1, ran.stdout[-3000:]
    (entry,) = json.loads((tmp_path / "minify-captures" / "captures.json").read_text())["captures"]
    assert entry["tests"] == ["test_relu.py::test_relu"] and entry["name"] == "test_relu.py-test_relu"
