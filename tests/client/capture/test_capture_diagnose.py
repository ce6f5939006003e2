"""Failures no captured graph holds (capture/diagnose.py): a script or test that fails after
compiling something, with nothing captured, is rerun with torch.compile off, then backends eager
and aot_eager, then its own backend, and the layer to blame is said, with the next step, in the
runner's output or the plugin's summary and in DIR/diagnoses.json. The user's outcome is unchanged.

The family: real dynamo-level and AOT-level bugs of torch 2.13 CPU (restated from public PyTorch
issues, in tests/crash_suite/case_no_graph.py), the program's own failure (it fails without
torch.compile too), and a backend's wrong values that the accuracy capture (off here) would have
caught.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from minify_client.capture import rerun, torch_hooks
from minify_client.capture.diagnose import Rerun, Servers, _verdict, pytest_command, script_command
from tests.support.subprocesses import run_clean

REPO = Path(__file__).resolve().parents[3]
SUITE = REPO / "tests" / "crash_suite"

PROGRAM = """
import torch
total = torch.compile(lambda x: x.sum(), backend="eager")(torch.ones(3))
assert total == 4, f"the sum is {total}"
"""
BACKEND = """
import torch
from tests.support.backends import wrong_on_relu
x = torch.randn(8)
assert torch.equal(torch.compile(torch.relu, backend=wrong_on_relu)(x), torch.relu(x)), "relu differs"
"""
# Strict torch.export of submodules kept in a plain list (pytorch#150428): export's own KeyError,
# which TORCHDYNAMO_DISABLE=1 does not turn off; not the program's failure.
EXPORT = """
import torch

class Shift(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.offset = torch.nn.Parameter(torch.full((2, 3), 0.5))

    def forward(self, x):
        return x + self.offset

class Chain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stages = [Shift(), Shift()]

    def forward(self, x):
        for stage in self.stages:
            x = stage(x)
        return x

torch.export.export(Chain(), (torch.ones(2, 3),), strict=True)
"""
CASES = {"program": (PROGRAM, ["no torch.compile"], "AssertionError"),
         "export": (EXPORT, ["no torch.compile"], "KeyError"),
         "backend": (BACKEND, ["no torch.compile", "eager", "aot_eager", "your backend"], "AssertionError")}
SAID = {"program": "it fails without torch.compile too (TORCHDYNAMO_DISABLE=1): the failure is the program's own",
        "export": "inside torch.export, which the program calls itself",
        "backend": "so your backend's compiled code is to blame"}


def _run(command: list[str], cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return run_clean(command, cwd, timeout_s=900, **extra)


# The runner takes the layers the plugin's summary test does not: the program's own failure and the
# backend's (all four rerun settings). Dynamo's and AOT autograd's are the plugin test's two cases,
# and AOT autograd's the runner's too in tests/test_realbugs.py (#139789, through bench/realbugs).
@pytest.mark.parametrize("layer", sorted(CASES))
def test_runner_says_which_layer_a_failure_no_graph_holds_is_in(tmp_path: Path, layer: str) -> None:
    script, settings, error = CASES[layer]
    if layer == "export" and _strict_export_takes_a_plain_list_of_modules():
        import torch

        pytest.skip(f"pytorch#150428 is fixed in torch {torch.__version__}: the program exports")
    (tmp_path / "script.py").write_text(textwrap.dedent(script))
    done = _run([sys.executable, "-m", "minify_client.capture", "--diagnose", "--dir", "caps", "script.py"], tmp_path)
    assert done.returncode == 1 and error in done.stderr  # the script's own outcome
    assert SAID[layer] in done.stderr, done.stderr[-3000:]
    [entry] = json.loads((tmp_path / "caps" / "diagnoses.json").read_text())["diagnoses"]
    assert (entry["test"], entry["layer"]) == ("script.py", layer)
    assert entry["signature"].startswith(error)
    assert [rerun["setting"] for rerun in entry["reruns"]] == settings
    assert [rerun["outcome"] for rerun in entry["reruns"]] == ["passes"] * (len(settings) - 1) + ["fails the same way"]
    assert all((tmp_path / "caps" / rerun["log"]).is_file() for rerun in entry["reruns"])
    assert not (tmp_path / "caps" / "captures.json").exists()


def _strict_export_takes_a_plain_list_of_modules() -> bool:
    """Whether this torch has pytorch#150428 fixed (EXPORT's program then exports)."""
    namespace: dict[str, object] = {}
    try:
        exec(textwrap.dedent(EXPORT), namespace)  # the program's own source: it exports, or raises
    except KeyError:
        return False
    return True


@pytest.mark.parametrize("how", ["fresh", "served"])
def test_a_script_rerun_runs_it_as_python_m_would_without_importing_the_client(tmp_path: Path, how: str) -> None:
    """The rerun's script sees the argv, sys.path, `__main__` and environment that `python -m
    minify_client.capture.rerun script.py` gives it, and no module of the client but rerun.py: in a
    fresh interpreter, and in a child of the server the stages fork from (`rerun.Server`), which
    sets the stage's variables and writes the output to the stage's log."""
    (tmp_path / "script.py").write_text(textwrap.dedent("""
        import json, os, sys
        client = sorted(name for name in sys.modules if name.startswith("minify_client"))
        print(json.dumps({"argv": sys.argv, "path": sys.path[:2], "name": __name__, "client": client,
                          "stage": os.environ.get("TORCH_BISECT_BACKEND"), "cwd": os.getcwd()}))
        sys.exit(5)
    """))
    (tmp_path / "cwd").mkdir()
    command = script_command(str(tmp_path / "script.py"), ["--epochs", "1"], tmp_path / "cwd")
    out, stage = tmp_path / "out.json", {"TORCH_BISECT_BACKEND": "eager"}
    if how == "fresh":
        done = _run(command.fresh(), tmp_path / "cwd", MINIFY_RERUN_OUT=str(out), **stage)
        returncode, output = done.returncode, done.stdout
    else:
        server = rerun.Server(["json"], cwd=command.cwd, environment=rerun.environment({}))
        try:
            ended = server.run({"argv": list(command.argv), "cwd": str(command.cwd), "out": str(out),
                                "log": str(tmp_path / "stage.log"), "timeout_s": 120, "settings": stage})
        finally:
            server.close()
        assert ended is not None and not ended["timed_out"]
        returncode, output = ended["returncode"], (tmp_path / "stage.log").read_text()
    seen = json.loads(output)
    assert returncode == 5 and seen == {"argv": [str(tmp_path / "script.py"), "--epochs", "1"], "name": "__main__",
                                        "path": [str(tmp_path), str(tmp_path / "cwd")], "client": [],
                                        "stage": "eager", "cwd": str(tmp_path / "cwd")}
    assert json.loads(out.read_text()) == {"failed": True, "signature": "SystemExit: N",
                                           "raised_in": None, "raised_at": "sys.exit(5)"}


@pytest.mark.fast
def test_the_stages_fork_from_one_server_unless_the_program_sets_variables_torch_reads_on_import(
        tmp_path: Path) -> None:
    """What the diagnosis's server imports: for a script, the torch modules it imports and what
    torch.compile will; for a test, its file's and its conftest.py files' (from the root down),
    with pytest and the rerun plugin; nothing where any of them may change the environment, or where
    a source cannot be parsed."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "test_model.py").write_text("import torch\n\ndef test_step():\n    torch.compile(torch.sin)\n")
    (tmp_path / "conftest.py").write_text("import torch._inductor.config\n")
    script = script_command("sub/test_model.py", [], tmp_path)
    assert script.preload() == ["torch", "torch._dynamo", "torch._dynamo.backends.common", "torch._inductor.compile_fx"]
    test = pytest_command("sub/test_model.py::test_step", tmp_path, None)
    assert test.cwd == tmp_path and test.argv[:2] == ("--pytest", "sub/test_model.py::test_step")
    assert test.preload() == ["torch", "torch._inductor.config", "torch._dynamo", "torch._dynamo.backends.common",
                              "torch._inductor.compile_fx", "pytest", rerun.__name__]
    (tmp_path / "sub" / "conftest.py").write_text("import os\nos.environ['TORCHINDUCTOR_FREEZING'] = '1'\n")
    conftests = [tmp_path / "conftest.py", tmp_path / "sub" / "conftest.py"]
    assert rerun.conftests(tmp_path / "sub" / "test_model.py", tmp_path) == conftests
    assert rerun.conftests(tmp_path / "sub" / "test_model.py")[-2:] == conftests  # up to the root of the disk
    assert pytest_command("sub/test_model.py::test_step", tmp_path, None).preload() == []
    (tmp_path / "broken.py").write_text("import torch\ndef (\n")
    assert script_command("broken.py", [], tmp_path).preload() == []


def test_diagnoses_share_a_server_per_list_of_modules_and_replace_one_that_died(tmp_path: Path) -> None:
    """A pytest run's diagnoses (the plugin's session end) take their servers from one `Servers`:
    failures whose files import the same torch modules fork from one server, other lists get
    their own, none for a program whose reruns are fresh, and a server that died is started again.
    (Real `serve` processes; a module cheaper than torch stands for what they import.)"""
    with Servers() as servers:
        first = servers.get(["json"], tmp_path)
        assert first is not None and first.alive()
        assert servers.get(["json"], tmp_path) is first
        other = servers.get(["json", "csv"], tmp_path)
        assert other is not None and other is not first
        assert servers.get([], tmp_path) is None
        first.close()
        again = servers.get(["json"], tmp_path)
        assert again is not None and again is not first and again.alive()
        (tmp_path / "ok.py").write_text("import json\n")
        answer = again.run({"argv": ["ok.py"], "cwd": str(tmp_path), "out": str(tmp_path / "out.json"),
                            "timeout_s": 60, "settings": {}})
        assert answer == {"returncode": 0, "timed_out": False}
    assert not again.alive() and not other.alive()


def test_a_server_probes_the_cpus_vector_isa_once_a_run_did_and_its_later_runs_inherit_it(tmp_path: Path) -> None:
    """Inductor probes the CPU's vector ISA once per process (a dozen `python -c` dlopen checks,
    ~2 CPU-s) before its first CPU compile: every run forked from a server paid it again. A run
    that probed tells the server, which probes before the next fork; a run that chose its ISA
    itself (`cpp.vec_isa_ok`) or never compiled for the CPU leaves the server as it was. (The
    script calls the probe as inductor's codegen does, without a compile's seconds.)"""
    script = tmp_path / "isa.py"
    script.write_text(textwrap.dedent("""
        import sys
        import torch
        import torch._inductor.cpu_vec_isa as isa
        inherited = isa.valid_vec_isa_list.cache_info().currsize
        if sys.argv[1] == "own-choice":
            torch._inductor.config.cpp.vec_isa_ok = True
        if sys.argv[1] != "none":
            isa.pick_vec_isa()
        with open(sys.argv[2], "a") as seen:
            seen.write(f"{sys.argv[1]} {inherited}\\n")
    """))
    seen = tmp_path / "seen.txt"
    server = rerun.Server(rerun.server_modules([script]), cwd=tmp_path, environment=rerun.environment({}))
    try:
        for run in ("none", "own-choice", "none", "probe", "none", "probe"):
            answer = server.run({"argv": [script.name, run, str(seen)], "cwd": str(tmp_path),
                                 "out": str(tmp_path / "out.json"), "timeout_s": 120, "settings": {}})
            assert answer == {"returncode": 0, "timed_out": False}, (tmp_path / "out.json").read_text()
    finally:
        server.close()
    assert seen.read_text().splitlines() == ["none 0", "own-choice 0", "none 0", "probe 0", "none 1", "probe 1"]


def test_runner_without_diagnose_reruns_nothing(tmp_path: Path) -> None:
    (tmp_path / "script.py").write_text(textwrap.dedent(PROGRAM))
    done = _run([sys.executable, "-m", "minify_client.capture", "--dir", "caps", "script.py"], tmp_path)
    assert done.returncode == 1 and "no graph captured" not in done.stderr
    assert not (tmp_path / "caps" / "diagnoses.json").exists()


# What the sample suite's tests do without the plugin (tests/crash_suite/case_no_graph.py: two
# failures of torch 2.13 CPU, restated from public issues, and a test that passes).
PLAIN_OUTCOMES = {"tests/crash_suite/case_no_graph.py::test_identity_branch_is_replayed": "FAILED",
                  "tests/crash_suite/case_no_graph.py::test_aliased_view_rebuilt_from_the_base": "FAILED",
                  "tests/crash_suite/case_no_graph.py::test_compiles_and_matches": "PASSED"}


def test_pytest_plugin_summary_says_which_layer_each_uncaptured_failure_is_in(tmp_path: Path) -> None:
    """Under the plugin with diagnosis on, each test ends as it does without it (PLAIN_OUTCOMES),
    and the summary and diagnoses.json name each failure's layer."""
    command = [sys.executable, "-m", "pytest", "-c", str(SUITE / "suite.ini"), str(SUITE / "case_no_graph.py"),
               "-rA"]
    diagnosed = _run(command, REPO, MINIFY_CAPTURE_DIR=str(tmp_path / "caps"), MINIFY_CAPTURE_DIAGNOSE="1")
    assert diagnosed.returncode == 1, diagnosed.stdout[-3000:]
    outcomes = {line.split()[1]: line.split()[0] for line in diagnosed.stdout.splitlines()
                if line.startswith(("PASSED ", "FAILED "))}
    assert outcomes == PLAIN_OUTCOMES, diagnosed.stdout[-3000:]
    summary = diagnosed.stdout.split("minify: failures no captured graph holds", 1)[1]
    assert "case_no_graph.py::test_identity_branch_is_replayed: " in summary
    assert "so dynamo is to blame" in summary.split("case_no_graph.py::test_aliased")[0]
    assert "so AOT autograd is to blame" in summary.split("case_no_graph.py::test_aliased")[1]
    entries = json.loads((tmp_path / "caps" / "diagnoses.json").read_text())["diagnoses"]
    assert {entry["test"]: entry["layer"] for entry in entries} == {
        "case_no_graph.py::test_identity_branch_is_replayed": "dynamo",
        "case_no_graph.py::test_aliased_view_rebuilt_from_the_base": "aot_autograd"}


def _reruns(*outcomes: str) -> list[Rerun]:
    settings = ["no torch.compile", "eager", "aot_eager", "your backend"]
    return [Rerun(setting, outcome, None, 1.0, f"{setting}.log")  # type: ignore[arg-type]
            for setting, outcome in zip(settings, outcomes, strict=False)]


@pytest.mark.parametrize(("outcomes", "layer"), [
    (["fails the same way"], "program"),
    (["fails differently"], "program"),
    (["passes", "fails the same way"], "dynamo"),
    (["passes", "passes", "fails differently"], "aot_autograd"),
    (["passes", "passes", "passes", "fails the same way"], "backend"),
    (["passes", "passes", "passes", "passes"], "not_alone"),
    (["passes", "timed out"], None),
    (["could not run"], None),
])
def test_the_first_rerun_that_fails_names_the_layer(outcomes: list[str], layer: str | None) -> None:
    found = _verdict("t", "AssertionError", _reruns(*outcomes))
    assert found.layer == layer
    assert ("did not finish" in found.message) == (layer is None)


_OPTIONS = ("MINIFY_CAPTURE_ACCURACY", "MINIFY_CAPTURE_LEVEL", "MINIFY_CAPTURE_CRASH")


@pytest.mark.parametrize("accuracy", [False, True])
@pytest.mark.parametrize("aot_level", [False, True])
@pytest.mark.parametrize("crash", [False, True])
def test_the_next_step_names_only_the_capture_options_the_run_did_not_have_on(
        monkeypatch: pytest.MonkeyPatch, accuracy: bool, aot_level: bool, crash: bool) -> None:
    for name in _OPTIONS:
        monkeypatch.delenv(name, raising=False)
    if accuracy:
        monkeypatch.setenv("MINIFY_CAPTURE_ACCURACY", "1")
    if aot_level:
        monkeypatch.setenv("MINIFY_CAPTURE_LEVEL", "aot")
    if crash:
        monkeypatch.setenv("MINIFY_CAPTURE_CRASH", "1")
    backend = _verdict("t", "AssertionError", _reruns("passes", "passes", "passes", "fails the same way")).message
    aot = _verdict("t", "AssertionError", _reruns("passes", "passes", "fails the same way")).message
    assert ("MINIFY_CAPTURE_ACCURACY=1 captures" in backend) == (not accuracy)
    assert ("MINIFY_CAPTURE_CRASH=1" in backend) == (not crash)
    assert ("MINIFY_CAPTURE_LEVEL=aot checks each graph" in backend) == (accuracy and not aot_level)
    assert ("accuracy check was on at the aot level" in backend) == (accuracy and aot_level)
    assert "compiler_bisector" in backend and "{" not in backend
    assert ("MINIFY_CAPTURE_LEVEL=aot MINIFY_CAPTURE_ACCURACY=1 captures it" in aot) == (not (accuracy and aot_level))
    assert ("made outside the graphs" in aot) == (accuracy and aot_level)
    assert "module: aotdispatch" in aot and "{" not in aot


def test_the_next_step_names_a_test_to_reduce_by_its_node_id_and_a_script_as_script() -> None:
    """`minify-client reduce` takes a test as pytest names it: the diagnosis of a test says that
    command for it; a script's (named here by a sanitized name, not its path) says SCRIPT."""
    test = "tests/test_model.py::test_step[cpu]"
    dynamo = _verdict(test, "AssertionError", _reruns("passes", "fails the same way")).message
    aot = _verdict(test, "AssertionError", _reruns("passes", "passes", "fails the same way")).message
    script = _verdict("repro_py", "AssertionError", _reruns("passes", "fails the same way")).message
    assert f"`minify-client reduce {test}` shrinks it" in dynamo and f"`minify-client reduce {test}`" in aot
    assert "`minify-client reduce SCRIPT` shrinks it" in script and "{" not in dynamo + aot + script


@pytest.mark.parametrize("aot_level", [False, True])
def test_a_check_that_could_not_judge_a_graph_is_never_called_finding_none_wrong(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, aot_level: bool) -> None:
    """pytorch#190855: the accuracy check could not lower a hessian's graph, and the diagnosis said
    the check "found no graph wrong", which sent the user looking elsewhere."""
    for name in _OPTIONS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MINIFY_CAPTURE_ACCURACY", "1")
    if aot_level:
        monkeypatch.setenv("MINIFY_CAPTURE_LEVEL", "aot")
    monkeypatch.setattr(torch_hooks, "skipped_checks", [])
    with caplog.at_level("WARNING", logger=torch_hooks.logger.name):
        for _ in range(2):
            torch_hooks._skipped("accuracy", RuntimeError("Cannot call storage_offset()\nframe #0"))
    assert [record.getMessage() for record in caplog.records] == [
        "minify: the accuracy check could not judge a compiled graph (RuntimeError: Cannot call storage_offset()): "
        "wrong values there are not captured"]

    backend = _verdict("t", "AssertionError", _reruns("passes", "passes", "passes", "fails the same way")).message
    aot = _verdict("t", "AssertionError", _reruns("passes", "passes", "fails the same way")).message

    assert "could not judge a graph (RuntimeError: Cannot call storage_offset())" in backend
    assert "found no graph wrong by torch's rule:" not in backend
    assert "made outside the graphs" not in aot


def test_a_failure_without_torch_compile_inside_torch_export_blames_export_not_the_program() -> None:
    export_failed = Rerun("no torch.compile", "fails the same way", "KeyError", 1.0, "log", "torch.export")
    assert _verdict("t", "KeyError", [export_failed]).layer == "export"
    private = Rerun("no torch.compile", "fails differently", "UserError", 1.0, "log", "torch._export.utils")
    assert _verdict("t", "KeyError", [private]).layer == "export"
    for raised_in in ("torch.nn.modules.module", "torch.functional", None):
        own = Rerun("no torch.compile", "fails the same way", "RuntimeError", 1.0, "log", raised_in)
        assert _verdict("t", "RuntimeError", [own]).layer == "program"


def test_torch_exports_refusal_is_the_programs_to_change_and_its_internal_error_a_bug_to_report() -> None:
    """Both are export's layer; the message tells a refusal (export asking the program to change,
    by its exception type) from an error of export's own."""
    internal = Rerun("no torch.compile", "fails the same way", "KeyError", 1.0, "log", "torch.export")
    message = _verdict("t.py::test_x", "KeyError", [internal]).message
    assert "report it to PyTorch (module: export)" in message and "refused the program" not in message
    signature = "GuardOnDataDependentSymNode: Could not guard on data-dependent expression Eq(uN, N)"
    refused = Rerun("no torch.compile", "fails the same way", signature, 1.0, "log", "torch.export")
    diagnosis = _verdict("t.py::test_x", signature, [refused])
    assert diagnosis.layer == "export"
    assert "torch.export refused the program as written (GuardOnDataDependentSymNode)" in diagnosis.message
    assert "nothing to report as a bug" in diagnosis.message and "report it to PyTorch" not in diagnosis.message
    assert "`minify-client reduce t.py::test_x`" in diagnosis.message


@pytest.mark.fast
def test_export_refusals_are_told_by_their_exception_type() -> None:
    from minify_client.capture.rerun import export_refusal

    assert export_refusal("UserError: Dynamic control flow is not supported") == "UserError"
    assert export_refusal("torch._dynamo.exc.Unsupported: call_method") == "Unsupported"
    assert export_refusal("GuardOnDataDependentSymNode") == "GuardOnDataDependentSymNode"
    assert export_refusal("KeyError: 'stages.0'") is None
    assert export_refusal("AssertionError") is None
    assert export_refusal(None) is None


def _raised(call: Callable[[], object]) -> BaseException:
    try:
        call()
    except Exception as error:  # the error is the subject
        return error
    raise AssertionError("it did not raise")


def test_a_rerun_says_which_torch_module_the_program_called_when_it_failed() -> None:
    """The family: strict export's internal error and a non-strict export's refusal of
    data-dependent control flow are torch.export's; a module's shape error is in torch.nn; an
    operator's error raised in C++ has no torch frame."""
    import torch

    from minify_client.capture.rerun import EXPORT_REFUSALS, export_refusal, torch_entry
    from minify_contract.signatures import signature_line

    class Chain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stages = [torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)]  # a plain list: not registered

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for stage in self.stages:
                x = stage(x)
            return x

    class Branches(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1 if x.sum() > 0 else x - 1

    x = torch.ones(2, 3)
    refused = _raised(lambda: torch.export.export(Branches(), (x,), strict=False))
    assert torch_entry(refused) == "torch.export"
    # The data-dependent branch is export asking the program to change; the internal error (where this
    # torch still has pytorch#150428) is export's own.
    assert export_refusal(signature_line(refused)) in EXPORT_REFUSALS
    if not _strict_export_takes_a_plain_list_of_modules():
        internal = _raised(lambda: torch.export.export(Chain(), (x,), strict=True))
        assert torch_entry(internal) == "torch.export"
        assert export_refusal(signature_line(internal)) is None
    assert torch_entry(_raised(lambda: torch.nn.Linear(4, 3)(x))).startswith("torch.nn.modules")
    assert torch_entry(_raised(lambda: torch.ones(2) + torch.ones(3))) is None


def _dynamo_error() -> BaseException:
    import torch

    def breaks(x):
        torch._dynamo.graph_break()
        return x + 1

    try:
        torch.compile(breaks, backend="eager", fullgraph=True)(torch.ones(2))
    except Exception as error:  # the error dynamo raises is the subject
        return error
    raise AssertionError("dynamo traced a graph break under fullgraph")


def test_an_error_dynamo_raised_before_compiling_is_named_as_dynamo_s() -> None:
    from minify_client.capture.diagnose import refused_before_compile

    error = _dynamo_error()
    note = refused_before_compile(error)

    assert note is not None and "dynamo refused the program" in note and type(error).__name__ in note


def test_an_error_raised_from_a_dynamo_error_is_named_too() -> None:
    from minify_client.capture.diagnose import refused_before_compile

    try:
        raise RuntimeError("the user's wrapper") from _dynamo_error()
    except RuntimeError as error:
        assert refused_before_compile(error) is not None


@pytest.mark.parametrize("error", [RuntimeError("shape mismatch"), AssertionError("wrong values"), KeyError("x")])
def test_errors_not_from_dynamo_get_no_such_note(error: BaseException) -> None:
    from minify_client.capture.diagnose import refused_before_compile

    assert refused_before_compile(error) is None


def test_runner_names_a_fullgraph_refusal_as_dynamo_s(tmp_path: Path) -> None:
    script = tmp_path / "refused.py"
    script.write_text(textwrap.dedent("""
        import torch

        def f(x):
            torch._dynamo.graph_break()
            return x + 1

        torch.compile(f, backend="eager", fullgraph=True)(torch.ones(2))
    """))
    result = _run([sys.executable, "-m", "minify_client.capture", str(script)], tmp_path)

    assert result.returncode == 1
    assert "dynamo refused the program before any graph reached a compiler" in result.stderr
