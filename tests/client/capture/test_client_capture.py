"""`minify_client.capture`: a failing compile in a test suite becomes a job, or files to submit later."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from examples.programs import ReluCos
from minify_client.capture import capture, capture_failures
from minify_contract.models import JobSpec, JobState
from minify_worker.engine import minify
from minify_worker.programs.fx.backends import ALLOWED_BACKENDS_ENV
from tests.support.graphs import ops_of
from tests.support.scripted_server import ScriptedServer, closed_port_url, job_status, serve_job


class ScaledRelu(torch.nn.Module):
    def forward(self, x: torch.Tensor, *, scale: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * scale


class CompilerBug(RuntimeError):
    pass


def broken_backend(gm: torch.fx.GraphModule, example_inputs: list) -> None:
    raise CompilerBug("the compiler crashed on relu")


def failing_compile(model: torch.nn.Module, *args: torch.Tensor, **kwargs: torch.Tensor) -> None:
    torch._dynamo.reset()
    torch.compile(model, backend=broken_backend)(*args, **kwargs)


def test_a_failing_compile_saves_the_graph_the_backend_received_with_spec_and_inputs_and_reraises(tmp_path: Path):
    model, x = ReluCos(), torch.randn(3, 4)
    spec = {"config": {"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}}

    with pytest.raises(Exception, match="the compiler crashed on relu") as raised, capture_failures(
        model, (x,), spec=spec, save_to=tmp_path / "capture"
    ) as captured:
        failing_compile(model, x)

    directory = tmp_path / "capture"
    assert sorted(p.name for p in directory.iterdir()) == ["ReluCos.pt2", "inputs.pt", "spec.json"]
    program = torch.export.load(directory / "ReluCos.pt2")
    (output,) = program.module()(x)  # dynamo's graph: its outputs as a tuple
    assert torch.equal(output, model(x))
    assert JobSpec.model_validate_json((directory / "spec.json").read_text()) == JobSpec.model_validate({
        **spec, "backend": f"{broken_backend.__module__}:broken_backend",
        "failure": {"kind": "compile_error", "signature": "CompilerBug: the compiler crashed on relu"},
    })
    args, kwargs = torch.load(directory / "inputs.pt")
    assert torch.equal(args[0], x) and kwargs == {}
    assert captured.captured is not None and captured.captured.program == directory / "ReluCos.pt2"
    assert captured.captured.chain[-1] == "CompilerBug: the compiler crashed on relu"
    assert any(f"minify-client submit {directory / 'ReluCos.pt2'}" in note
               for note in getattr(raised.value, "__notes__", []))


def test_keyword_inputs_are_exported_and_saved(tmp_path: Path):
    x, scale = torch.randn(4), torch.tensor(2.0)
    captured = capture(ScaledRelu(), (x,), {"scale": scale}, save_to=tmp_path)
    program = torch.export.load(captured.program)
    assert torch.equal(program.module()(x, scale=scale), torch.relu(x) * 2)
    _, kwargs = torch.load(tmp_path / "inputs.pt")
    assert torch.equal(kwargs["scale"], scale)


def test_an_exported_program_is_saved_as_is(tmp_path: Path):
    x = torch.randn(2, 2)
    ep = torch.export.export(ReluCos(), (x,))
    captured = capture(ep, (x,), spec={"backend": "aot_inductor"}, save_to=tmp_path)
    assert captured.program == tmp_path / "program.pt2"
    assert captured.spec.backend == "aot_inductor"
    assert torch.export.load(captured.program).graph_signature == ep.graph_signature


def test_a_block_that_succeeds_captures_nothing(tmp_path: Path):
    with capture_failures(ReluCos(), (torch.randn(2),), save_to=tmp_path / "capture") as captured:
        pass
    assert captured.captured is None
    assert not (tmp_path / "capture").exists()


def test_as_a_decorator_it_captures_each_failing_call(tmp_path: Path):
    model, x = ReluCos(), torch.randn(2)

    @capture_failures(model, (x,), save_to=tmp_path / "capture")
    def compile_model() -> None:
        raise CompilerBug("boom")

    with pytest.raises(CompilerBug):
        compile_model()
    assert (tmp_path / "capture" / "ReluCos.pt2").is_file()


def test_only_the_listed_exceptions_are_captured(tmp_path: Path):
    with pytest.raises(KeyError), capture_failures(ReluCos(), (torch.randn(2),), save_to=tmp_path / "c",
                                                   exceptions=(CompilerBug,)):
        raise KeyError("not a compiler failure")
    assert not (tmp_path / "c").exists()


def test_a_capture_submitted_to_a_server_leaves_no_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    with ScriptedServer() as server:
        serve_job(server, job_status("j7", JobState.queued), [])
        with pytest.raises(CompilerBug) as raised, capture_failures(
            ReluCos(), (torch.randn(2),), submit_to=server.url, token="t0ken"
        ) as captured:
            raise CompilerBug("boom")
        (upload,) = server.requests_to("POST", "/v1/jobs")

    assert captured.captured is not None and captured.captured.job is not None
    assert captured.captured.job.id == "j7"
    assert upload.headers["authorization"] == "Bearer t0ken"
    assert b'filename="ReluCos.pt2"' in upload.body and b'filename="inputs.pt"' in upload.body
    assert "submitted as minify job j7" in raised.value.__notes__[0]
    assert os.listdir(tmp_path) == []


def test_a_capture_that_fails_never_hides_the_original_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MINIFY_RETRY_FOR", "0")
    url = closed_port_url()
    with pytest.raises(CompilerBug, match="boom") as raised, capture_failures(
        ReluCos(), (torch.randn(2),), submit_to=url
    ) as captured:
        raise CompilerBug("boom")
    assert captured.capture_error is not None
    assert f"could not capture the failing program: cannot reach minify server at {url}" in (
        raised.value.__notes__[0]
    )


def test_without_destinations_the_environment_decides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MINIFY_CAPTURE_DIR", str(tmp_path / "captures"))
    captured = capture(ReluCos(), (torch.randn(2),), name="relu_case")
    assert captured.program == tmp_path / "captures" / "relu_case" / "relu_case.pt2"
    assert captured.program.is_file()


# ---- the torch config in effect is recorded in the spec ----------------------------------------


def saved_config(directory: Path) -> dict:
    return json.loads((directory / "spec.json").read_text())["config"]


def test_config_set_around_the_block_is_recorded_as_spec_config(tmp_path: Path):
    model, x = ReluCos(), torch.randn(3)
    with torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}), \
            torch._dynamo.config.patch(assume_static_by_default=False), \
            torch._functorch.config.patch(donated_buffer=False), \
            pytest.raises(Exception, match="crashed on relu"), capture_failures(model, (x,), save_to=tmp_path):
        failing_compile(model, x)
    assert saved_config(tmp_path) == {
        "cpp.inject_relu_bug_TESTING_ONLY": "compile_error",
        "torch._dynamo.config.assume_static_by_default": False,
        "torch._functorch.config.donated_buffer": False,
    }


def test_config_patched_inside_the_block_is_read_when_the_compile_starts(tmp_path: Path):
    model, x = ReluCos(), torch.randn(3)
    torch._dynamo.reset()  # outside the block: a reset inside it drops the compile-start hook
    with pytest.raises(Exception, match="crashed on relu"), capture_failures(model, (x,), save_to=tmp_path):
        with torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}):
            torch.compile(model, backend=broken_backend)(x)
    assert saved_config(tmp_path) == {"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}


def test_the_specs_own_config_keys_win_over_the_recorded_ones(tmp_path: Path):
    with torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "compile_error", "freezing": True}):
        captured = capture(ReluCos(), (torch.randn(2),), save_to=tmp_path,
                           spec={"config": {"cpp.inject_relu_bug_TESTING_ONLY": "runtime_error"}})
    assert captured.spec.config == {"cpp.inject_relu_bug_TESTING_ONLY": "runtime_error", "freezing": True}


def _cached_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    from minify_client.capture import config

    monkeypatch.setenv("MINIFY_CACHE_DIR", str(tmp_path))
    path = config._cache_path()
    assert path is not None and path.parent == config.defaults_cache_dir() == tmp_path / "capture-defaults"
    environment = {name: value for name, value in os.environ.items() if not name.startswith("TORCH")}
    config._store(path, {"environment": config._key_environment(environment, set()), "keyed_volatile": [],
                         "defaults": {"freezing": "as cached"}})
    return path, environment


def test_cached_defaults_serve_only_the_environment_they_were_read_in(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch):
    """A variable torch's config modules read (CXX, AOT_INDUCTOR_*, CI) set otherwise, or one
    added, misses; TORCH* variables (never seen by the fresh Python) and volatile ones (a test's
    name, the working and temp dirs, the address inductor sets once it loaded a kernel) do not."""
    from minify_client.capture import config

    path, environment = _cached_environment(monkeypatch, tmp_path)
    assert config._cached_defaults(path, environment) == {"freezing": "as cached"}
    volatile = {"PYTEST_CURRENT_TEST": "other.py::test", "PWD": "/elsewhere", "TMPDIR": "/tmp/other",
                "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR": "140212345678912"}
    assert config._cached_defaults(path, {**environment, **volatile}) == {"freezing": "as cached"}
    for name in ("CXX", "AOT_INDUCTOR_DEBUG_COMPILE", "CI"):
        assert config._cached_defaults(path, {**environment, name: "another value"}) is None, name
    without_path = {name: value for name, value in environment.items() if name != "PATH"}
    assert config._cached_defaults(path, without_path) is None


def test_the_cache_file_keeps_no_variables_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The environment holds secrets (CI tokens, cloud keys); a cache file, which CI may keep and
    upload, holds a digest of it and the names of volatile variables read, never a value."""
    from minify_client.capture import config

    monkeypatch.setenv("SOME_SERVICE_TOKEN", "s3cr3t-value-0123456789")
    path, environment = _cached_environment(monkeypatch, tmp_path)
    assert "s3cr3t-value-0123456789" not in path.read_text() and "SOME_SERVICE_TOKEN" not in path.read_text()
    assert config._cached_defaults(path, environment) == {"freezing": "as cached"}
    assert config._cached_defaults(path, {**environment, "SOME_SERVICE_TOKEN": "rotated"}) is None


def test_a_volatile_variable_a_config_module_read_keys_the_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Where the fresh Python saw a config module read a volatile variable (TMPDIR here), its
    entry serves only that variable's value; the same environment read again replaces its entry."""
    from minify_client.capture import config

    path, environment = _cached_environment(monkeypatch, tmp_path)
    path.unlink()
    read_in = {**environment, "TMPDIR": "/tmp/read-in"}
    entry = {"environment": config._key_environment(read_in, {"TMPDIR"}), "keyed_volatile": ["TMPDIR"],
             "defaults": {"freezing": "keyed by TMPDIR"}}
    config._store(path, entry)
    config._store(path, entry)
    assert len(json.loads(path.read_text())) == 1
    assert config._cached_defaults(path, read_in) == {"freezing": "keyed by TMPDIR"}
    assert config._cached_defaults(path, {**environment, "TMPDIR": "/tmp/other"}) is None


def test_another_torch_or_python_has_a_cache_file_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from minify_client.capture import config

    path, _ = _cached_environment(monkeypatch, tmp_path)
    monkeypatch.setattr(torch, "__version__", "2.99.0")
    assert config._cache_path() not in (None, path)
    monkeypatch.undo()
    monkeypatch.setenv("MINIFY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(torch, "__file__", str(tmp_path / "elsewhere" / "torch" / "__init__.py"))
    assert config._cache_path() not in (None, path)
    monkeypatch.undo()
    monkeypatch.setenv("MINIFY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "other-python"))
    assert config._cache_path() not in (None, path)


def test_a_corrupt_cache_file_serves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from minify_client.capture import config

    path, environment = _cached_environment(monkeypatch, tmp_path)
    for corrupt in ("{not json", '{"a": "dict"}', '[{"environment": "x"}]', ""):
        path.write_text(corrupt)
        assert config._cached_defaults(path, environment) is None


def test_a_torchinductor_setting_is_recorded_against_defaults_read_without_it_then_cached(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """With TORCHINDUCTOR_FREEZING=1 set, the defaults are read in a fresh Python that does not see
    it (over a corrupt cache file, which is replaced); a new process, served from that cache (the
    file is not written again), records the setting."""
    from minify_client.capture import config

    path, _ = _cached_environment(monkeypatch, tmp_path)
    monkeypatch.setenv("TORCHINDUCTOR_FREEZING", "1")
    path.write_text("{not json")
    config._defaults_without_environment.cache_clear()
    try:
        defaults = config._defaults_without_environment()
    finally:
        config._defaults_without_environment.cache_clear()
    assert defaults is not None and defaults["freezing"] is False
    assert json.loads(path.read_text())[-1]["defaults"] == defaults
    written = path.stat().st_mtime_ns

    script = "from minify_client.capture import changed_config; print(changed_config())"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip().splitlines()[-1:] == ["{'freezing': True}"], done.stderr[-2000:]
    assert path.stat().st_mtime_ns == written


def test_a_config_dependent_failure_captured_in_a_pytest_run_is_minimized(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch):
    """A setting patched inside the block of a test in a pytest run is recorded, and the job on the
    capture reproduces only because the worker applies it: the backend fails on relu only under
    inductor's relu-bug setting (tests/support/config_backends.py), with no g++ per candidate. The
    setting's own failure under real inductor, captured in a pytest run and minimized to the relu,
    is test_capture_plugin.py's graph-break capture."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_model.py").write_text(textwrap.dedent(f"""
        import torch
        from minify_client.capture import capture_failures
        from tests.support.config_backends import fail_on_relu_while_injected


        class ReluCos(torch.nn.Module):
            def forward(self, x):
                return torch.cos(torch.relu(x))


        def test_compiled_model_runs():
            model, x = ReluCos(), torch.randn(8)
            with capture_failures(model, (x,), save_to={str(tmp_path / "capture")!r}):
                with torch._inductor.config.patch({{"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}}):
                    torch.compile(model, backend=fail_on_relu_while_injected)(x)
    """))
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_model.py"],
                         cwd=suite, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 1, ran.stdout[-3000:]
    capture_dir = tmp_path / "capture"
    assert saved_config(capture_dir) == {"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}
    spec = json.loads((capture_dir / "spec.json").read_text())
    assert spec["backend"] == "tests.support.config_backends:fail_on_relu_while_injected"

    # The engine in this process, as the RQ worker runs it (preloaded: its sandboxes fork from here),
    # on the spec as captured; the inputs' shrink, the culprit and version phases, which come after minimality,
    # left out (they have their own tests).
    monkeypatch.setenv(ALLOWED_BACKENDS_ENV, "tests.support")
    spec = {**spec, "culprit": False, "versions": False, "shrink": False}
    minified = minify(capture_dir / "ReluCos.pt2", JobSpec.model_validate(spec), tmp_path / "out",
                      inputs=capture_dir / "inputs.pt")
    assert minified.status is JobState.succeeded, minified.reason
    assert minified.report.nodes_final == 1 and "relu" in minified.report.graph_code


XDIST_SUITE = """
import pytest
import torch

from tests.support.backends import fail_on_relu


def compile_and_run(model, x):
    torch._dynamo.reset()  # each test compiles afresh, as in separate test files
    torch.compile(model, backend=fail_on_relu)(x)


@pytest.mark.parametrize("seed", range(6))
def test_one_bug(seed):
    compile_and_run(lambda x: torch.tanh(torch.relu(x) + 1), torch.randn(3, 5))


@pytest.mark.parametrize("seed", range(2))
def test_another_bug(seed):
    compile_and_run(lambda x: torch.relu(x) * 3, torch.randn(2, 2))
"""


def test_pytest_xdist_workers_capture_each_bug_once_with_every_test_that_hit_it(tmp_path: Path):
    """Each xdist worker runs a capture session of its own, all into one directory: none may lose
    another's entries or capture a bug another already has."""
    (tmp_path / "test_bugs.py").write_text(XDIST_SUITE)
    environment = {key: value for key, value in os.environ.items() if not key.startswith(("MINIFY_", "PYTEST_"))}
    environment.update(PYTHONPATH=str(Path(__file__).resolve().parents[3]), MINIFY_CAPTURE_DIR=str(tmp_path / "c"))
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "test_bugs.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300, env=environment)
    assert ran.returncode == 1 and "8 failed" in ran.stdout, ran.stdout[-3000:]

    entries = json.loads((tmp_path / "c" / "captures.json").read_text())["captures"]
    tests = sorted(sorted(entry["tests"]) for entry in entries)
    one_bug = sorted(f"test_bugs.py::test_one_bug[{seed}]" for seed in range(6))
    another = sorted(f"test_bugs.py::test_another_bug[{seed}]" for seed in range(2))
    assert tests == sorted([one_bug, another]), json.dumps(entries, indent=1)
    assert sorted(path.name for path in (tmp_path / "c").iterdir() if path.is_dir()) == sorted(
        entry["name"] for entry in entries)  # no capture saved twice
    assert "(6 tests)" in ran.stdout and "(2 tests)" in ran.stdout  # the summary reads what the workers wrote


# ---- the backend is recorded as the user named it ----------------------------------------------


def test_backends_are_recorded_as_named_in_torch_compile():
    from torch._dynamo.eval_frame import get_compiler_fn

    from minify_client.capture.torch_hooks import backend_name
    from tests.support.backends import fail_on_relu

    def named(backend: object) -> str:  # the wrapper torch.compile(backend=...) makes
        wrapper = (torch._TorchCompileInductorWrapper("default", None, None) if backend == "inductor"
                   else torch._TorchCompileWrapper(backend, None, None, None))
        return backend_name(get_compiler_fn(wrapper))

    assert named("inductor") == "inductor"
    assert named("aot_eager") == "aot_eager"
    assert named(broken_backend) == f"{broken_backend.__module__}:broken_backend"
    assert named(fail_on_relu) == "tests.support.backends:fail_on_relu"  # made by a factory, bound at module level
    assert named(lambda gm, inputs: gm).startswith("<function")  # nothing a worker could import


def test_a_test_id_names_its_capture():
    from minify_client.capture.session import safe_name

    assert safe_name("tests/test_model.py::test_compiles[cuda-2]") == "test_model.py-test_compiles-cuda-2"


# ---- the graph inductor received, and wrong results ---------------------------------------------


@pytest.mark.inductor
def test_level_aot_captures_the_graph_inductor_received(tmp_path: Path):
    model, x = ReluCos(), torch.randn(3, 4)
    torch._dynamo.reset()
    with torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}), \
            pytest.raises(Exception, match="CppCompileError"), \
            capture_failures(model, (x,), save_to=tmp_path, level="aot") as captured:
        torch.compile(model)(x)
    program = torch.export.load(tmp_path / "ReluCos.pt2")
    # After AOT autograd: aten ops over the placeholders AOT autograd named, as inductor saw them.
    assert ops_of(program.graph) == ["relu", "cos"]
    placeholders = [node.name for node in program.graph.nodes if node.op == "placeholder"]
    assert placeholders in (["arg0_1"], ["primals_1"]), placeholders  # dynamo's would be l_x_
    assert captured.captured is not None and captured.captured.spec.backend == "inductor"
    assert captured.captured.spec.failure.signature.startswith("CppCompileError: ")


@pytest.mark.inductor
def test_accuracy_captures_a_wrong_result_though_nothing_raised(tmp_path: Path):
    model, x = ReluCos(), torch.randn(3, 4)
    torch._dynamo.reset()
    with torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "accuracy"}), \
            capture_failures(model, (x,), save_to=tmp_path, accuracy=True) as captured:
        torch.compile(model)(x)
    assert captured.captured is not None
    spec = captured.captured.spec
    assert (spec.failure.kind, spec.failure.signature) == ("accuracy", "AccuracyError")
    assert spec.config == {"cpp.inject_relu_bug_TESTING_ONLY": "accuracy"}
    assert captured.captured.chain[0].startswith("AccuracyError: RMSE")
