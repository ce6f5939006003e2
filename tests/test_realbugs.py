"""The real-bug corpus (bench/realbugs/): its scripts' shape, and a handful of its cases taken the user's
way by the runner, one per class of issue 38, each asserted to end as the code on main ends it today:
a minimal repro with the same signature, or its specific reason for not being one.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.repro import run_repro

REALBUGS = Path(__file__).resolve().parents[1] / "bench" / "realbugs"
sys.path.insert(0, str(REALBUGS))

import catalog  # noqa: E402  (bench/realbugs is no package: its scripts run as `python pt_N.py`)


def _load_runner():
    """bench/realbugs/run.py under a name of its own (bench/run.py is another `run`)."""
    spec = importlib.util.spec_from_file_location("realbugs_run", REALBUGS / "run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


runner = _load_runner()
CASES = {case.name: case for case in catalog.all_cases()}


def test_the_corpus_holds_one_script_per_issue() -> None:
    numbers = [case.number for case in CASES.values()]
    assert numbers and len(set(numbers)) == len(numbers)


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_script_is_named_after_its_issue_and_runs_as_a_program_and_as_a_test(name: str) -> None:
    case = CASES[name]
    assert case.issue.startswith("https://github.com/pytorch/pytorch/issues/")
    assert name.startswith(f"pt_{case.number}_")
    assert "2.13.0" in case.fails_on
    tree = ast.parse(case.path.read_text())
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert f"test_{name}" in functions
    main_guard = [node for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)]
    assert main_guard and f"test_{name}()" in ast.unparse(main_guard[0])


def test_a_header_without_its_kind_is_refused_with_the_file_named(tmp_path: Path) -> None:
    script = tmp_path / "pt_1_missing.py"
    script.write_text('"""Summary.\n\nissue:    https://github.com/pytorch/pytorch/issues/1\nchecks: x\n'
                      'fails on: 2.13.0\nfeature: y\n"""\n')
    with pytest.raises(ValueError, match=re.escape("pt_1_missing.py: header lacks kind")):
        catalog.read_case(script)


def test_an_unknown_kind_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "pt_2_odd.py"
    script.write_text('"""Summary.\n\nissue:    https://github.com/pytorch/pytorch/issues/2\nchecks: x\n'
                      'fails on: 2.13.0\nkind: slow\nfeature: y\n"""\n')
    with pytest.raises(ValueError, match="kind 'slow' is not one of"):
        catalog.read_case(script)


# One case per class of issue 38, the cheap ones (an eager or aot_eager backend, or one small inductor
# graph), through the runner's own steps (capture, minify-worker minify, repro.py), ours only.
LIMITS = runner.Limits(script_s=240, minify_s=180, repro_s=120, diagnose=False)
RUNNERS_OWN_STEP = runner.run_step


def take(name: str, tmp_path: Path, diagnose: bool = False):
    limits = runner.Limits(LIMITS.script_s, LIMITS.minify_s, LIMITS.repro_s, diagnose)
    runner.run_step = _repro_forked_from_the_suites_server
    try:
        return runner.run_case(CASES[name], tmp_path, ["ours"], limits)
    finally:
        runner.run_step = RUNNERS_OWN_STEP


def _repro_forked_from_the_suites_server(name: str, command: list[str], cwd: Path, log: Path, limit_s: float,
                                         env: dict[str, str] | None = None) -> object:
    """The runner's own step, but for `python repro.py`, which forks from the suite's repro server as
    every repro.py of the suite does (tests/support/repro_forks.py: a fork of an interpreter that
    imported what each repro.py imports first, then the script run as `__main__` in its folder, which
    a fresh interpreter runs in its place where the environment or the script's first lines differ):
    some 3 CPU-s of torch's imports fewer per case. Its output and exit are read as the runner reads
    a fresh run's."""
    if name != "ours_repro":
        return RUNNERS_OWN_STEP(name, command, cwd, log, limit_s, env)
    assert command == [runner.PYTHON, "repro.py"], command
    step = runner.Step(command=" ".join(command), log=str(log))
    started = time.monotonic()
    try:
        done = run_repro(cwd / "repro.py", limit_s, **(env or {}))
        code, text = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired:
        code, text = None, ""
    log.write_text(text)
    step.seconds = round(time.monotonic() - started, 1)
    return runner.ended(step, code, limit_s, text)


@pytest.mark.inductor
def test_integer_wrong_values_from_inductor_end_in_a_minimal_repro(tmp_path: Path) -> None:
    result = take("pt_191308_int8_bmm_dtype", tmp_path)
    assert result.original_error.startswith("AssertionError: compiled torch.int64")
    assert result.ours.captured
    assert result.ours.verdict == "minimal repro: 1 -> 1 ops"
    # A dtype that differs (int64 for int8) is a plain AccuracyError, not "integer outputs only", in
    # the capture, the worker and repro.py alike (the corpus run at f986f59 said the same).
    assert result.ours.repro_observed == result.ours.repro_expected == "AccuracyError"


@pytest.mark.inductor
def test_two_outputs_inductor_returns_as_one_tensor_end_in_a_minimal_repro(tmp_path: Path) -> None:
    """#191449: inductor returns an intermediate and a view of it as one tensor, and the program's
    `resize_` of the view, after a graph break, grows the intermediate too. No graph's values are
    wrong; the capture sees the two outputs merged (`accuracy.merged_outputs`), the worker judges
    it so, and repro.py fails with the same key."""
    result = take("pt_191449_resize_view_of_intermediate", tmp_path)
    assert result.original_error.startswith("AssertionError: compiled shape (12,) != eager (1,)")
    assert result.ours.captured and result.ours.minimal, result.ours.verdict
    assert result.ours.repro_observed == result.ours.repro_expected == "AccuracyError: outputs merged"


def test_a_graph_reused_on_aliased_inputs_is_said_and_its_layer_diagnosed(tmp_path: Path) -> None:
    """#139789: dynamo reuses a graph compiled for separate inputs on overlapping views (a missing
    guard on input aliasing); no graph the worker compiles holds that, so nothing is captured, and
    the capture says why beside the layer its reruns blame."""
    result = take("pt_139789_mutation_aliasing_recompile", tmp_path, diagnose=True)
    assert result.original_error.startswith("AssertionError: compiled [3.0, 3.0, 3.0, 3.0]")
    assert not result.ours.captured
    assert result.ours.verdict.startswith("nothing captured: minify: dynamo reused, without recompiling, a graph "
                                          "compiled for inputs sharing no memory on inputs sharing 0 and 1")
    assert "; diagnosed: aot_autograd (it passes with backend 'eager' and fails with 'aot_eager' (dynamo and AOT " \
           "autograd, no compiler)). Next: TORCH_LOGS=aot_graphs" in result.ours.verdict  # the layer's next step


def test_a_higher_order_op_dynamo_refuses_is_named_as_dynamo_s(tmp_path: Path) -> None:
    # dynamo fails before any backend is called: nothing compiled, so nothing to capture or rerun;
    # the note quotes dynamo's explanation of the refusal
    result = take("pt_158566_scan_item_in_body", tmp_path, diagnose=True)
    assert result.original_error.startswith("torch._dynamo.exc.UncapturedHigherOrderOpError")
    assert result.ours.verdict.startswith("nothing captured: minify: dynamo refused the program before any graph "
                                          "reached a compiler (UncapturedHigherOrderOpError: Expected combine_fn to "
                                          "be wrapped as functools.partial")


@pytest.mark.inductor
def test_a_graph_torch_export_save_refuses_is_captured_as_program_json_and_ends_minimal(tmp_path: Path) -> None:
    """#166525: a while_loop carrying a Python int, which torch.export.save cannot write, is captured as
    program.json; the worker compiles it as dynamo does (its carry an unbacked symbol) and repro.py
    fails with the issue's error."""
    result = take("pt_166525_while_loop_int_state", tmp_path)
    assert result.ours.captured and result.ours.minimal, result.ours.verdict
    assert result.ours.signature == ("AssertionError: A subgraph argument other than striding has been modified; "
                                     "FakeTensorUpdater cannot update this argument!")
    out = tmp_path / "pt_166525_while_loop_int_state" / "ours"
    assert (out / "minimized.json").exists() and not (out / "minimized.pt2").exists()



def test_a_custom_function_s_backward_is_captured_and_ends_minimal(tmp_path: Path) -> None:
    """#172956: AOT autograd's partitioner fails on an autograd.Function whose backward writes into
    a tensor it saved; torch.export would keep the forward only, so the capture keeps the Function
    with its backward as program.json, and repro.py fails with the issue's error."""
    result = take("pt_172956_autograd_function_mutates_saved", tmp_path)
    assert result.ours.captured and result.ours.minimal, result.ours.verdict
    assert result.ours.signature == "AssertionError: Node add was invalid, but is output"
    assert result.ours.repro_observed == result.ours.repro_expected == result.ours.signature
    out = tmp_path / "pt_172956_autograd_function_mutates_saved" / "ours"
    assert (out / "minimized.json").exists() and not (out / "minimized.pt2").exists()


def test_a_compile_inside_an_autocast_region_is_captured_with_the_region_and_its_repro_fails_in_it(
        tmp_path: Path) -> None:
    """#179804: a function compiled with aot_eager and called inside a CPU bf16 autocast region
    has an `autocast(enabled=False)` block whose backward AOT autograd runs in bf16. Dynamo keeps
    the outer region out of the graph, so the capture records it (spec.autocast), the worker runs
    the forward in it and takes gradients after it, as the program does, and so does repro.py."""
    result = take("pt_179804_autocast_disabled_backward", tmp_path)
    assert result.ours.captured and result.ours.minimal, result.ours.verdict
    assert result.ours.repro_observed == result.ours.repro_expected == result.ours.signature == "GradientError"
    captures = tmp_path / "pt_179804_autocast_disabled_backward" / "captures"
    entry = json.loads((captures / "captures.json").read_text())["captures"][0]
    assert json.loads((captures / entry["spec"]).read_text())["autocast"] == {"device": "cpu", "dtype": "bfloat16"}


def test_a_hang_reduction_is_read_and_its_result_held_to_running_past_the_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `kind: hang` case (pytorch#148073): the runner reads `reduce --hang`'s report, and holds the
    reduced script to running past `HANG_S` under torch.compile in each fresh run (stopped there) and
    ending without it; before, a hang's report was not read and its runs were bounded by nothing of
    theirs."""
    # The capture first watches for it (MINIFY_CAPTURE_HANG, tests/client/capture/test_capture_hang.py).
    assert runner.capture_env(CASES["pt_148073_doubling_chain_compile_hang"], diagnose=False) == {
        "MINIFY_CAPTURE_HANG": "60"}
    reduction = runner.Reduction()
    log = ("reduce: x.py runs past 60 s under torch.compile; it ends within them without it\n"
           "reduced x.py from 25 to 13 lines in 28 runs, 494 s (the budget ran out: the smallest so far): x.min.py\n"
           "it runs past 60 s under torch.compile, and ends within them without it\n")
    runner.read_reduce_log(reduction, runner.Step(command="reduce", log="", exit="0"), log)
    assert (reduction.status, reduction.lines_after, reduction.finished) == ("reduced", 13, False)
    assert reduction.message == "runs past 60 s under torch.compile"

    monkeypatch.setattr(runner, "HANG_S", 1.0)
    out = tmp_path / "x.min.py"
    # Waits, where #148073's compile spins: each of the runs below would spin a core to the bound.
    out.write_text("import os\nimport threading\nif os.environ.get('TORCHDYNAMO_DISABLE') != '1':\n"
                   "    threading.Event().wait()\n")
    result = runner.CaseResult(case="x", issue="", kind="hang", feature="")
    result.ours.reduction = reduction
    runner.check_reduced(out, tmp_path, result, runner.Limits(script_s=30, minify_s=30, repro_s=30), hang=True)
    assert reduction.verified and reduction.reduced_failed == runner.REDUCED_RUNS, reduction.verdict


@pytest.mark.fast
def test_a_hangs_repro_is_held_to_running_past_the_bound_it_stops_itself_at() -> None:
    """repro.py of a hang stops itself at the bound the job saw it hang past (exit 124, `repro failed
    with: TimedOut`: tests/worker/engine/test_hang_bound.py); one that ends sooner, or otherwise, is
    no hang."""
    bound = runner.HANG_S
    assert runner.hang_repro_held(runner.Step("repro", exit="124", seconds=bound + 0.5), "TimedOut")
    assert runner.hang_repro_held(runner.Step("repro", exit=runner.timeout_exit(bound + 60), seconds=bound + 60),
                                  "")
    assert not runner.hang_repro_held(runner.Step("repro", exit="124", seconds=bound / 2), "TimedOut")
    assert not runner.hang_repro_held(runner.Step("repro", exit="0", seconds=bound + 1), "")
    assert not runner.hang_repro_held(runner.Step("repro", exit="124", seconds=bound + 1), "RuntimeError: x")
