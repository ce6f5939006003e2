"""`minify_client.capture`: a failing compile in a test suite becomes a job, or files to submit later."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from examples.programs import ReluCos
from minify_client.capture import capture, capture_failures
from minify_client.models import JobSpec, JobState
from tests.test_client_support import ScriptedServer, closed_port_url, job_status, serve_job


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


def test_a_failing_compile_is_saved_as_program_spec_and_inputs_and_the_error_reraised(tmp_path: Path):
    model, x = ReluCos(), torch.randn(3, 4)
    spec = {"config": {"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}}

    with pytest.raises(Exception, match="the compiler crashed on relu") as raised, capture_failures(
        model, (x,), spec=spec, save_to=tmp_path / "capture"
    ) as captured:
        failing_compile(model, x)

    directory = tmp_path / "capture"
    assert sorted(p.name for p in directory.iterdir()) == ["ReluCos.pt2", "inputs.pt", "spec.json"]
    program = torch.export.load(directory / "ReluCos.pt2")
    assert torch.equal(program.module()(x), model(x))
    assert JobSpec.model_validate_json((directory / "spec.json").read_text()) == JobSpec.model_validate(spec)
    args, kwargs = torch.load(directory / "inputs.pt")
    assert torch.equal(args[0], x) and kwargs == {}
    assert captured.captured is not None and captured.captured.program == directory / "ReluCos.pt2"
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


def test_a_capture_that_fails_never_hides_the_original_error(tmp_path: Path):
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
