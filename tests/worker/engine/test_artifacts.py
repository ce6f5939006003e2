"""What a compiler engineer receives: minimized.pt2, inputs.pt, repro.py, report.json, bundle.tar.gz.

Every repro here runs as `python repro.py` in a real subprocess, from a directory that holds only
the artifacts (and, for custom backends, a backend module of the test's own): a fork of one
interpreter that ran every repro.py's two first imports and nothing else (`repros`,
tests/support/repro_forks.py), or a fresh
interpreter where it needs another PYTHONPATH or is pasted alone.
"""

from __future__ import annotations

import json
import math
import operator
import os
import re
import signal
import tarfile
import textwrap
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.fx as fx

from examples import programs
from minify_contract.models import JobSpec, JobState, Report, TimelinePoint
from minify_worker import oracle
from minify_worker.engine import artifacts
from minify_worker.outcomes import Signature
from minify_worker.programs.fx import artifacts as fx_artifacts
from minify_worker.programs.fx import graph as G
from minify_worker.programs.fx import repro
from tests.support.graphs import AOTI_RELU_CODE
from tests.support.repro import Repros, run_repro

RELU_BACKENDS = '''
import os
import re
import signal

import torch


class ReluNotSupported(RuntimeError):
    pass


def _has_relu(gm):
    return any(node.target is torch.ops.aten.relu.default for node in gm.graph.nodes)


def fail_on_relu(gm, example_inputs):
    if _has_relu(gm):
        raise ReluNotSupported("relu is not supported by this backend")
    return gm


def segfault_on_relu(gm, example_inputs):
    if _has_relu(gm):
        os.kill(os.getpid(), signal.SIGSEGV)
    return gm
'''


# --- fixtures: flat graphs and value stores built from the example programs -----------------


@pytest.fixture(scope="module")
def repros() -> Repros:
    """The repros whose folder is all they need run as `python repro.py` would, each in a fork of
    the test process's one interpreter that ran their first lines, `import torch` and `import
    torch._inductor.config` (tests/support/repro.py): those imports once, not once per repro. Those
    run with another PYTHONPATH keep a fresh interpreter (`run_repro` starts one for them)."""
    return Repros()




def _value_store(ep: torch.export.ExportedProgram, args: tuple[Any, ...], graph: fx.Graph) -> dict[str, Any]:
    """What the prepare step stores: every placeholder's value and every promotable intermediate's."""
    state = {**ep.state_dict, **ep.constants}
    user_args = iter(torch.utils._pytree.tree_leaves(args))
    values: dict[str, Any] = {}
    for spec in ep.graph_signature.input_specs:
        values[spec.arg.name] = state[spec.target].detach() if spec.target in state else next(user_args)

    class Record(fx.Interpreter):
        def run_node(self, node: fx.Node) -> Any:
            result = super().run_node(node)
            if G.is_promotable(node):
                values[node.meta[G.META_VALUE]] = result
            return result

    with torch.no_grad():
        Record(G.to_graph_module(graph)).run(*(values[node.name] for node in G.placeholders(graph)))
    return values


def _program(builder: str) -> tuple[fx.Graph, dict[str, Any]]:
    ep, (args, _) = programs.BUILDERS[builder]()
    graph = G.flat_graph_from_exported_program(ep)
    return graph, _value_store(ep, args, graph)


@pytest.fixture(scope="module")
def seed_aoti() -> tuple[fx.Graph, dict[str, Any]]:
    """The seed's AOTI result: `linear -> relu`, `linear` promoted to an input."""
    graph, values = _program("linear_relu_sigmoid")
    minimal = G.canonicalize(G.truncate_after(G.promote_to_inputs(graph, ["linear"]), "relu"))
    return minimal, values


@pytest.fixture(scope="module")
def relu_cos() -> tuple[fx.Graph, dict[str, Any]]:
    return _program("relu_cos")


def _relu_only(relu_cos: tuple[fx.Graph, dict[str, Any]]) -> fx.Graph:
    return G.truncate_after(relu_cos[0], "relu")


def _cos_only(relu_cos: tuple[fx.Graph, dict[str, Any]]) -> fx.Graph:
    return G.canonicalize(G.promote_to_inputs(relu_cos[0], ["relu"]))


def _write(graph: fx.Graph, values: dict[str, Any], out_dir: Path, signature: Signature | None = None,
           **spec: Any) -> dict[str, Any]:
    return fx_artifacts.write_program_files(graph, values, out_dir, JobSpec(**spec), signature)


def _failure_line(stderr: str) -> str:
    """What repro.py prints after the traceback: "ExceptionType: first line of the message"."""
    lines = [line for line in stderr.splitlines() if line.startswith("repro failed with: ")]
    assert len(lines) == 1, stderr
    return lines[0].removeprefix("repro failed with: ")


# --- minimized.pt2 and inputs.pt ------------------------------------------------------------


def test_minimized_pt2_of_the_seed_aoti_case_has_linear_as_its_only_input(seed_aoti, tmp_path):
    graph, values = seed_aoti

    result = _write(graph, values, tmp_path, backend="aot_inductor")

    assert artifacts.MINIMIZED in result["files"]
    loaded = torch.export.load(tmp_path / artifacts.MINIMIZED)
    assert str(loaded.module(check_guards=False).code).strip() == AOTI_RELU_CODE


def test_minimized_pt2_runs_on_inputs_pt_like_the_graph(seed_aoti, tmp_path):
    graph, values = seed_aoti
    _write(graph, values, tmp_path)

    inputs = torch.load(tmp_path / artifacts.INPUTS, weights_only=True)
    (relu,) = torch.export.load(tmp_path / artifacts.MINIMIZED).module()(*inputs)

    assert torch.equal(relu, torch.relu(values["linear"]))


def test_inputs_pt_holds_the_placeholder_values_in_order_and_loads_weights_only(seed_aoti, tmp_path):
    graph, values = seed_aoti
    _write(graph, values, tmp_path)

    inputs = torch.load(tmp_path / artifacts.INPUTS, weights_only=True)

    assert isinstance(inputs, tuple)
    assert len(inputs) == 1
    assert torch.equal(inputs[0], values["linear"])


def test_inputs_pt_keeps_scalar_inputs_as_python_scalars(tmp_path):
    graph = fx.Graph()
    x, scale = graph.placeholder("x"), graph.placeholder("scale")
    graph.output((graph.call_function(torch.ops.aten.mul.Tensor, (x, scale)),))
    values = {"x": torch.ones(3), "scale": 2.5}

    _write(graph, values, tmp_path, backend="eager")

    assert torch.load(tmp_path / artifacts.INPUTS, weights_only=True)[1] == 2.5


def test_a_program_torch_export_refuses_still_gets_inputs_and_repro_and_is_minimized_json(tmp_path):
    graph = fx.Graph()
    a, b = graph.placeholder("a"), graph.placeholder("b")
    graph.output((graph.call_function(torch.ops.aten.mm.default, (a, b)),))
    values = {"a": torch.ones(2, 3), "b": torch.ones(2, 3)}  # mm of (2, 3) @ (2, 3): export raises

    result = _write(graph, values, tmp_path)

    assert sorted(result["files"]) == [artifacts.INPUTS, artifacts.MINIMIZED_JSON, artifacts.REPRO,
                                       artifacts.SIGNATURE_RULES]
    assert result["errors"][artifacts.MINIMIZED].startswith("RuntimeError")
    document = json.loads((tmp_path / artifacts.MINIMIZED_JSON).read_text())  # program.json's format
    assert G.graph_shape_hash(G.graph_from_wire(document["graph"])) == G.graph_shape_hash(graph)
    assert document["why"].startswith("torch.export cannot write it (RuntimeError")


def test_write_program_artifacts_is_a_sandbox_call_with_json_arguments(seed_aoti, tmp_path):
    graph, values = seed_aoti
    signature = Signature("compile_error", "CppCompileError", "C++ compile error", "CppCompileError: ...")
    kwargs = json.loads(json.dumps({
        "wire_graph": G.graph_to_wire(graph),
        "out_dir": str(tmp_path),
        "spec_json": JobSpec(backend="aot_inductor").model_dump_json(),
        "signature": asdict(signature),
    }))

    result = fx_artifacts.write_program_artifacts(SimpleNamespace(values=values), **kwargs)

    assert json.loads(json.dumps(result)) == {
        "files": [artifacts.INPUTS, artifacts.REPRO, artifacts.SIGNATURE_RULES, artifacts.MINIMIZED], "errors": {}}
    assert "# Signature:        CppCompileError: C++ compile error" in (tmp_path / artifacts.REPRO).read_text()


def test_write_program_artifacts_writes_nothing_to_a_relative_out_dir_and_says_why(seed_aoti, tmp_path,
                                                                                  monkeypatch):
    monkeypatch.chdir(tmp_path)  # a sandbox child's working directory is not its caller's
    graph, values = seed_aoti
    result = fx_artifacts.write_program_artifacts(SimpleNamespace(values=values), wire_graph=G.graph_to_wire(graph),
                                               out_dir="out/relu", spec_json=JobSpec().model_dump_json())

    assert result["files"] == []
    assert set(result["errors"]) == {artifacts.INPUTS, artifacts.REPRO, artifacts.MINIMIZED}
    assert "'out/relu' is relative" in result["errors"][artifacts.REPRO]
    assert list(tmp_path.iterdir()) == []


# --- repro.py: what it says -------------------------------------------------------------------


def test_repro_forward_is_the_graph_as_aten_calls_in_a_repro_module(seed_aoti):
    text = repro.render_repro(seed_aoti[0], JobSpec(), None, "2.13.0")

    assert textwrap.dedent("""\
        class Repro(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()

            def forward(self, linear):
                relu = torch.ops.aten.relu.default(linear);  linear = None
                return (relu,)
        """) in text


def test_repro_header_states_kind_signature_backend_device_torch_version_and_how_to_run(seed_aoti):
    signature = Signature("runtime_error", "RuntimeError", "shape mismatch: N vs N",
                          "RuntimeError: shape mismatch: 3 vs 4\nmore detail")
    spec = JobSpec(backend="aot_inductor", device="cuda:1")

    header = repro.render_repro(seed_aoti[0], spec, signature, "2.11.0").split("\nimport ")[0]

    assert "# Expected failure: runtime_error" in header
    assert "# Signature:        RuntimeError: shape mismatch: N vs N" in header
    assert "# As observed:      RuntimeError: shape mismatch: 3 vs 4\n" in header
    assert "# Backend:          aot_inductor" in header
    assert "# Device:           cuda:1" in header
    assert "# Minimized with:   torch 2.11.0" in header
    assert "# Run: python repro.py" in header


def test_repro_header_leaves_out_the_observed_text_when_the_signature_says_it_all(seed_aoti):
    signature = Signature("compile_error", "CppCompileError", "C++ compile error",
                          "CppCompileError: C++ compile error\nCommand: g++ ...")

    text = repro.render_repro(seed_aoti[0], JobSpec(), signature, "2.13.0")

    assert "# Signature:        CppCompileError: C++ compile error" in text
    assert "# As observed:" not in text


def test_repro_of_a_custom_backend_says_its_module_must_be_importable(seed_aoti):
    text = repro.render_repro(seed_aoti[0], JobSpec(backend="pkg.backends:broken"), None, "2.13.0")

    assert "# Custom backend:   imported by path: pkg.backends must be importable" in text
    assert "importlib.import_module('pkg.backends'), 'broken')" in text


def test_repro_expects_the_observed_failure_kind_over_the_spec_kind(seed_aoti):
    observed = Signature("accuracy", "AccuracyError", "Bad accuracy detected")

    text = repro.render_repro(seed_aoti[0], JobSpec(), observed, "2.13.0")

    assert "FAILURE_KIND = 'accuracy'" in text


def test_repro_sets_each_recorded_inductor_config_override(seed_aoti):
    spec = JobSpec(config={"cpp.inject_relu_bug_TESTING_ONLY": "compile_error", "max_autotune": True})

    text = repro.render_repro(seed_aoti[0], spec, None, "2.13.0")

    assert "torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = 'compile_error'\n" in text
    assert "torch._inductor.config.max_autotune = True\n" in text


def test_repro_sets_recorded_dynamo_and_functorch_config_in_their_modules(seed_aoti):
    spec = JobSpec(config={"torch._dynamo.config.assume_static_by_default": False,
                           "torch._functorch.config.donated_buffer": False, "freezing": True})

    text = repro.render_repro(seed_aoti[0], spec, None, "2.13.0")

    assert "import torch._dynamo.config\nimport torch._functorch.config\n" in text
    assert "\ntorch._dynamo.config.assume_static_by_default = False\n" in text
    assert "\ntorch._functorch.config.donated_buffer = False\n" in text
    assert "\ntorch._inductor.config.freezing = True\n" in text
    compile(text, "repro.py", "exec")


def test_repro_refuses_a_config_key_that_is_not_a_dotted_name(seed_aoti):
    with pytest.raises(ValueError, match="dotted"):
        repro.render_repro(seed_aoti[0], JobSpec(config={"cpp..x": 1}), None, "2.13.0")


def test_repro_imports_nothing_from_minify(seed_aoti):
    text = repro.render_repro(seed_aoti[0], JobSpec(backend="pkg.backends:broken"), None, "2.13.0")

    imports = [line for line in text.splitlines() if line.lstrip().startswith(("import ", "from "))]
    assert imports
    assert not any("minify" in line for line in imports)
    compile(text, "repro.py", "exec")


# --- repro.py: what it does ---------------------------------------------------------------------


def test_repro_of_a_custom_backend_failure_raises_the_same_exception(relu_cos, tmp_path, repros):
    """relu_cos's inputs are too big to write inline: this repro reads them from inputs.pt (the
    small ones' tests follow below)."""
    (tmp_path / "relu_backends.py").write_text(RELU_BACKENDS)
    _write(relu_cos[0], relu_cos[1], tmp_path, backend="relu_backends:fail_on_relu")
    text = (tmp_path / "repro.py").read_text()

    run = repros.run(tmp_path / "repro.py")

    assert "def load_inputs(path):" in text and "--inputs" in text
    assert run.returncode == 1
    assert "relu_backends.ReluNotSupported: relu is not supported by this backend" in run.stderr
    assert _failure_line(run.stderr) == "ReluNotSupported: relu is not supported by this backend"


def test_repro_of_a_passing_program_exits_zero(relu_cos, tmp_path, repros):
    (tmp_path / "relu_backends.py").write_text(RELU_BACKENDS)
    _write(_cos_only(relu_cos), relu_cos[1], tmp_path, backend="relu_backends:fail_on_relu")

    run = repros.run(tmp_path / "repro.py")

    assert run.returncode == 0, run.stderr
    assert "repro passed" in run.stdout


def test_repro_of_a_crash_dies_by_the_same_signal(relu_cos, tmp_path, repros):
    (tmp_path / "relu_backends.py").write_text(RELU_BACKENDS)
    _write(_relu_only(relu_cos), relu_cos[1], tmp_path, oracle.crash_signature(signal.SIGSEGV),
           backend="relu_backends:segfault_on_relu", failure={"kind": "crash"})

    run = repros.run(tmp_path / "repro.py")

    assert run.returncode == -signal.SIGSEGV
    # Where it died, before the signal ended it: compiling (the backend's frame), not running.
    assert "Fatal Python error: Segmentation fault" in run.stderr, run.stderr[-2000:]
    assert re.search(r'File ".*relu_backends\.py", line \d+ in segfault_on_relu', run.stderr), run.stderr[-2000:]


@pytest.fixture(scope="module")
def small_passing_repro(tmp_path_factory: pytest.TempPathFactory, repros: Repros) -> tuple[str, Any]:
    """A small repro (its inputs inline) of a program that passes and calls Python functions and
    indexes tuples, run once for the tests that ask what it says and that it exits zero (each run
    is a fresh interpreter importing torch: seconds of CPU). Its text and its run."""
    directory = tmp_path_factory.mktemp("small-passing")
    graph = fx.Graph()
    x = graph.placeholder("x")
    halves = graph.call_function(torch.ops.aten.split.Tensor, (x, 2))
    first = graph.call_function(operator.getitem, (halves, 0))
    scale = graph.call_function(math.sqrt, (4.0,))
    full = graph.call_function(torch.ops.aten.full.default, ([2], math.inf),
                               {"dtype": torch.float16, "device": torch.device("cpu")})
    graph.output((graph.call_function(torch.ops.aten.mul.Tensor, (first, scale)), full))
    _write(graph, {"x": torch.arange(4.0)}, directory, backend="eager")

    return (directory / artifacts.REPRO).read_text(), repros.run(directory / "repro.py")


def test_repro_runs_graphs_that_call_python_functions_and_index_tuples(small_passing_repro):
    text, run = small_passing_repro

    assert "from math import sqrt as math_sqrt" in text
    assert run.returncode == 0, run.stderr


@pytest.mark.inductor
def test_repro_reproduces_an_inductor_compile_error(relu_cos, tmp_path, repros):
    """relu_cos's inputs, read from inputs.pt: the full repro's inductor compile, for real."""
    _write(_relu_only(relu_cos), relu_cos[1], tmp_path, backend="inductor",
           config={"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"})

    run = repros.run(tmp_path / "repro.py")

    assert run.returncode == 1
    # The root cause, in the form the engine records it (the compiler's first error: line).
    assert _failure_line(run.stderr) == "CppCompileError: \u2018compile\u2019 was not declared in this scope"
    assert "exception chain:   InductorError: CppCompileError: C++ compile error" in run.stderr


def test_repro_of_an_accuracy_error_says_what_minify_expected(relu_cos, tmp_path, repros):
    """Wrong values (a test backend that adds one to relu's results) fail the full repro (inputs
    from inputs.pt) with AccuracyError, and it says what minify expected: the accuracy check is
    the repro's own, whatever the backend. Real inductor's accuracy bug and its repro:
    test_a_small_inductor_repro_fails_as_the_job_did; the full repro's inductor compile, for real:
    the test above."""
    _write(_relu_only(relu_cos), relu_cos[1], tmp_path,
           Signature("accuracy", "AccuracyError", ""),
           backend="tests.support.backends:wrong_on_relu", failure={"kind": "accuracy"})

    run = repros.run(tmp_path / "repro.py")

    assert "def load_inputs(path):" in (tmp_path / "repro.py").read_text()
    assert run.returncode == 1
    assert _failure_line(run.stderr) == "AccuracyError"
    assert run.stderr.strip().endswith("minify expected:   AccuracyError")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_repro_moves_inputs_to_the_spec_device(relu_cos, tmp_path):
    (tmp_path / "relu_backends.py").write_text(RELU_BACKENDS + textwrap.dedent('''
        def require_cuda(gm, example_inputs):
            assert all(value.is_cuda for value in example_inputs), "inputs are not on cuda"
            return gm
        '''))
    _write(relu_cos[0], relu_cos[1], tmp_path, backend="relu_backends:require_cuda", device="cuda")

    run = run_repro(tmp_path / "repro.py", PYTHONPATH=str(tmp_path))

    assert run.returncode == 0, run.stderr
    assert torch.load(tmp_path / artifacts.INPUTS, weights_only=True)[0].device.type == "cpu"


# --- repro.py with its inputs inline --------------------------------------------------------------


@pytest.mark.parametrize("value", [
    torch.tensor([0.1, -2.5, 3e-8, float("nan"), float("inf"), float("-inf"), -0.0], dtype=torch.float32),
    torch.tensor([[0.1, 1 / 3], [2.0, -7.25]], dtype=torch.float64),
    torch.tensor([0.1, 65504.0, 6e-8], dtype=torch.float16),
    torch.tensor([0.1, 3.0e38, -1.5], dtype=torch.bfloat16),
    torch.tensor(2.5, dtype=torch.float32),
    torch.tensor([[1, -2], [3, 2**40]], dtype=torch.int64),
    torch.tensor([255, 0], dtype=torch.uint8),
    torch.tensor([True, False]),
    torch.empty(0, 3),
])
def test_inline_inputs_give_back_every_value_bit_for_bit(value: torch.Tensor) -> None:
    written = repro.inline_inputs([value, 3, 0.5, True])
    assert written is not None
    read = eval(f"[{written}]", {"torch": torch})

    assert read[1:] == [3, 0.5, True]
    assert read[0].dtype == value.dtype and read[0].shape == value.shape
    assert torch.equal(read[0].reshape(-1).view(torch.uint8), value.reshape(-1).view(torch.uint8))


@pytest.mark.parametrize("inputs", [
    [torch.ones(65)],  # more elements than a reader reads
    [torch.ones(40), torch.ones(40)],
    [torch.ones(4, 4).t()],  # a view's strides, which a layout-sensitive bug may need
    [torch.arange(8.0)[2:]],  # a storage offset
    [torch.ones(2, dtype=torch.complex64)],
    [torch.ones(2).requires_grad_()],
    [float("nan")],
])
def test_inputs_a_literal_would_not_keep_stay_in_inputs_pt(inputs: list[Any]) -> None:
    assert repro.inline_inputs(inputs) is None


SMALL_X = torch.tensor([-1.5, 0.25, 2.0, -0.0])


def test_a_one_op_repro_with_small_inputs_holds_them_and_reads_top_to_bottom(relu_cos):
    signature = Signature("compile_error", "CppCompileError", "'tmpN' was not declared in this scope")
    spec = JobSpec(backend="inductor", config={"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"})

    text = repro.render_repro(_relu_only(relu_cos), spec, signature, "2.13.0", {"OS": "Linux"},
                                  inputs=[SMALL_X])

    assert len(text.splitlines()) < 40
    assert "    torch.tensor([-1.5, 0.25, 2.0, -0.0], dtype=torch.float32),\n" in text
    assert "inputs.pt" not in text and "argparse" not in text and "def exception_chain" not in text
    assert "Linux" not in text  # the environment is report.json's and the bug report's
    order = [text.index(part) for part in ("# Signature: CppCompileError: 'tmpN'", "inject_relu_bug_TESTING_ONLY = ",
                                           "class Repro", "inputs = [", "compile_fx(gm, inputs)(*inputs)",
                                           'print(f"repro passed')]
    assert order == sorted(order)
    compile(text, "repro.py", "exec")


def test_a_repro_that_reads_inputs_pt_lists_the_environment_in_its_header(relu_cos):
    text = repro.render_repro(_relu_only(relu_cos), JobSpec(), None, "2.13.0", {"OS": "Linux", "GPU": "none"},
                                  inputs=[torch.randn(100)])
    header = text.split("\nimport ")[0]
    assert "# Environment it failed in (torch.utils.collect_env, on the worker):\n#   OS: Linux\n#   GPU: none" \
        in header


def test_an_aot_inductor_repro_reads_inputs_pt_whatever_their_size(relu_cos):
    text = repro.render_repro(_relu_only(relu_cos), JobSpec(backend="aot_inductor"), None, "2.13.0",
                                  inputs=[SMALL_X])
    assert "def load_inputs(path):" in text and "aoti_compile_and_package" in text


def test_a_small_repro_runs_alone_and_with_its_signature_rules(relu_cos, tmp_path):
    backends, out, alone_dir = tmp_path / "backends", tmp_path / "out", tmp_path / "alone"
    for folder in (backends, alone_dir):
        folder.mkdir()
    (backends / "relu_backends.py").write_text(RELU_BACKENDS)
    _write(_relu_only(relu_cos), {**relu_cos[1], "x": SMALL_X}, out, backend="relu_backends:fail_on_relu")
    (alone_dir / "repro.py").write_text((out / "repro.py").read_text())
    beside = run_repro(out / "repro.py", PYTHONPATH=str(backends))
    alone = run_repro(alone_dir / "repro.py", PYTHONPATH=str(backends))

    assert "inputs = [" in (out / "repro.py").read_text()
    assert beside.returncode == alone.returncode == 1
    assert _failure_line(beside.stderr) == "ReluNotSupported: relu is not supported by this backend"
    assert "relu_backends.ReluNotSupported: relu is not supported by this backend" in alone.stderr
    assert "repro failed with:" not in alone.stderr  # pasted alone: the traceback says it all


def test_a_small_repro_of_a_passing_program_exits_zero(small_passing_repro):
    text, run = small_passing_repro

    assert "inputs = [" in text
    assert run.returncode == 0, run.stderr
    assert "repro passed" in run.stdout


@pytest.mark.inductor
@pytest.mark.parametrize(("kind", "expected"), [
    ("compile_error", "CppCompileError: \u2018compile\u2019 was not declared in this scope"),
    ("accuracy", "AccuracyError"),
])
def test_a_small_inductor_repro_fails_as_the_job_did(relu_cos, tmp_path, kind, expected, repros):
    _write(_relu_only(relu_cos), {**relu_cos[1], "x": SMALL_X}, tmp_path, Signature(kind, expected.split(":")[0], ""),
           backend="inductor", config={"cpp.inject_relu_bug_TESTING_ONLY": kind}, failure={"kind": kind})

    run = repros.run(tmp_path / "repro.py")

    assert "inputs = [" in (tmp_path / "repro.py").read_text()
    assert run.returncode == 1
    assert _failure_line(run.stderr) == expected


# --- report.json and bundle.tar.gz --------------------------------------------------------------


def _report() -> Report:
    return Report(status=JobState.succeeded, nodes_original=3, nodes_final=1, checks_total=5,
                  signature="CppCompileError: C++ compile error", backend="inductor", device="cpu",
                  config={"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}, torch_version="2.13.0",
                  timeline=[TimelinePoint(elapsed_s=0.0, nodes=3, checks=0),
                            TimelinePoint(elapsed_s=1.5, nodes=1, checks=5)])


def test_report_json_is_the_report_model(tmp_path):
    path = artifacts.write_report(_report(), tmp_path)

    assert path == tmp_path / artifacts.REPORT
    assert Report.model_validate_json(path.read_text()) == _report()


def test_bundle_holds_every_artifact_under_one_folder(seed_aoti, tmp_path):
    _write(seed_aoti[0], seed_aoti[1], tmp_path)
    artifacts.write_report(_report(), tmp_path)

    with tarfile.open(artifacts.write_bundle(tmp_path)) as bundle:
        names = sorted(bundle.getnames())
        inputs = bundle.extractfile(f"{artifacts.BUNDLE_FOLDER}/{artifacts.INPUTS}").read()

    assert names == sorted(f"{artifacts.BUNDLE_FOLDER}/{name}" for name in
                           (artifacts.MINIMIZED, artifacts.INPUTS, artifacts.REPRO, artifacts.SIGNATURE_RULES,
                            artifacts.REPORT))
    assert inputs == (tmp_path / artifacts.INPUTS).read_bytes()


def test_bundle_bytes_depend_only_on_the_artifacts(tmp_path):
    artifacts.write_report(_report(), tmp_path)
    first = artifacts.write_bundle(tmp_path).read_bytes()
    os.utime(tmp_path / artifacts.REPORT, (0, 0))

    assert artifacts.write_bundle(tmp_path).read_bytes() == first
