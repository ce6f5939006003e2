"""`minify-client` as a user runs it: a subprocess, against a scripted server or a closed port."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from minify_contract.models import JobSpec, JobState, JobStatus, OriginalState, ProgressEvent
from tests.support.scripted_server import (  # fixtures server and program: tests/conftest.py
    Exchange,
    ScriptedServer,
    closed_port_url,
    job_status,
    minimizing_events,
    serve_job,
)

GRAPH_CODE = "def forward(self, x):\n    relu = torch.ops.aten.relu.default(x)\n    return (relu,)"
ARTIFACTS = {
    "minimized.pt2": b"pt2",
    "repro.py": b"raise SystemExit(1)\n",
    "inputs.pt": b"inputs",
}


def run_cli(*args: str | Path, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "minify_client.cli", *map(str, args)],
        capture_output=True, text=True, timeout=timeout, cwd=cwd, env=_env(env),
    )


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MINIFY_SERVER", "MINIFY_TOKEN")}
    return {**env, **(extra or {})}


def serve_finished_job(server: ScriptedServer, state: JobState, reason: str | None = None) -> None:
    names = [*ARTIFACTS, "report.json"] if state != JobState.cancelled else []
    status = job_status("j1", state, artifacts=names, reason=reason,
                        graph_code=GRAPH_CODE if state == JobState.succeeded else None)
    files = dict(ARTIFACTS)
    if status.result is not None:
        files["report.json"] = status.result.model_dump_json().encode()
    serve_job(server, status, minimizing_events(state), files)


# ---- packaging and usage ------------------------------------------------------------------------


def test_the_client_imports_without_torch():
    code = (
        "import sys\n"
        "class NoTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch is not installed here')\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        "import minify_client, minify_client.cli, minify_client.client, minify_client.capture\n"
        "minify_client.cli.build_parser()\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_help_lists_every_subcommand():
    result = run_cli("--help")
    assert result.returncode == 0
    for command in ("submit", "status", "watch", "download", "cancel", "list"):
        assert command in result.stdout


def test_no_subcommand_is_a_usage_error():
    assert run_cli().returncode == 2


def test_a_missing_program_file_is_a_usage_error(tmp_path: Path):
    result = run_cli("submit", tmp_path / "nope.pt2", "--server", closed_port_url())
    assert result.returncode == 2
    assert result.stderr == f"minify-client: error: no such program file: {tmp_path / 'nope.pt2'}\n"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--config", "no-equals-sign"], "--config expects KEY=VALUE"),
        (["--backend", "not a backend"], "invalid spec: backend"),
        (["--device", "tpu"], "invalid spec: device"),
    ],
)
def test_an_invalid_spec_is_a_usage_error_before_anything_is_sent(
    server: ScriptedServer, program: Path, flags: list[str], message: str
):
    result = run_cli("submit", program, *flags, "--server", server.url)
    assert result.returncode == 2
    assert message in result.stderr
    assert server.exchanges == []


# ---- errors talking to the server --------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [["submit", "PROGRAM"], ["submit", "PROGRAM", "--wait"], ["status", "j1"], ["watch", "j1"],
     ["download", "j1"], ["cancel", "j1"], ["list"]],
)
def test_a_stopped_server_gives_one_clear_line_and_exit_1(program: Path, tmp_path: Path, command: list[str]):
    url = closed_port_url()
    args = [program if part == "PROGRAM" else part for part in command]
    result = run_cli(*args, "--server", url, "--retry-for", "0", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith(f"minify-client: error: cannot reach minify server at {url}: ")
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", [["submit", "PROGRAM", "--wait"], ["watch", "j1"], ["download", "j1"]])
def test_an_unreachable_server_is_retried_for_retry_for_seconds_saying_so(program: Path, tmp_path: Path,
                                                                        command: list[str]):
    url = closed_port_url()
    args = [program if part == "PROGRAM" else part for part in command]
    started = time.monotonic()
    result = run_cli(*args, "--server", url, "--retry-for", "1.5", cwd=tmp_path)
    assert time.monotonic() - started >= 1.5
    assert result.returncode == 1
    said, error = result.stderr.splitlines()
    assert said.startswith("minify-client: server unreachable (")
    assert said.endswith("retrying for up to 1.5 s ...")
    assert error.startswith(f"minify-client: error: cannot reach minify server at {url}: ")
    assert error.endswith("(gave up after retrying for 1.5 s)")


def test_retry_for_comes_from_minify_retry_for_when_not_given(program: Path):
    result = run_cli("status", "j1", "--server", closed_port_url(), env={"MINIFY_RETRY_FOR": "0.5"})
    assert "retrying for up to 0.5 s" in result.stderr


@pytest.mark.parametrize(("flags", "env"), [(["--retry-for", "-1"], {}), ([], {"MINIFY_RETRY_FOR": "soon"})])
def test_a_retry_for_that_is_not_seconds_is_a_usage_error(flags: list[str], env: dict[str, str]):
    result = run_cli("status", "j1", "--server", closed_port_url(), *flags, env=env)
    assert result.returncode == 2
    assert "must be a number of seconds >= 0" in result.stderr


def test_the_server_comes_from_minify_server_when_not_given(program: Path):
    url = closed_port_url()
    result = run_cli("submit", program, "--retry-for", "0", env={"MINIFY_SERVER": url})
    assert f"cannot reach minify server at {url}" in result.stderr


def test_a_refused_token_is_one_line_and_exit_1(server: ScriptedServer, program: Path):
    server.route("POST", "/v1/jobs", lambda e: e.send_json(401, {"error": "missing or unknown bearer token"}))
    result = run_cli("submit", program, "--server", server.url, env={"MINIFY_TOKEN": "wrong"})
    assert result.returncode == 1
    assert result.stderr == "minify-client: error: the server answered 401: missing or unknown bearer token\n"
    assert server.exchanges[0].headers["authorization"] == "Bearer wrong"


def test_an_upload_the_server_refuses_is_a_usage_error(server: ScriptedServer, program: Path):
    server.route("POST", "/v1/jobs", lambda e: e.send_json(415, {"error": "program is not a .pt2 archive"}))
    result = run_cli("submit", program, "--server", server.url)
    assert result.returncode == 2
    assert "program is not a .pt2 archive" in result.stderr


def test_a_server_error_is_one_line_and_exit_1(server: ScriptedServer):
    server.route("GET", "/v1/jobs/j1", lambda e: e.send_bytes(500, b"Internal Server Error", "text/plain"))
    result = run_cli("status", "j1", "--server", server.url)
    assert result.returncode == 1
    assert result.stderr == "minify-client: error: the server answered 500: Internal Server Error\n"


def test_an_unknown_job_is_exit_1(server: ScriptedServer):
    result = run_cli("status", "nope", "--server", server.url)
    assert result.returncode == 1
    assert "404" in result.stderr


# ---- submit --------------------------------------------------------------------------------------


def test_submit_prints_the_job_id_then_the_dashboard_url(server: ScriptedServer, program: Path):
    serve_job(server, job_status("j1", JobState.queued), [])
    result = run_cli("submit", program, "--server", server.url,
                     "--config", "cpp.inject_relu_bug_TESTING_ONLY=compile_error")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["j1", f"dashboard: {server.url}/#/jobs/j1"]
    assert b"cpp.inject_relu_bug_TESTING_ONLY" in server.requests_to("POST", "/v1/jobs")[0].body


def test_submit_prints_each_warning_of_the_server_on_stderr(server: ScriptedServer, program: Path):
    warning = "no worker is serving the cuda queue; the job waits until one starts"
    server.route("POST", "/v1/jobs", lambda e: e.send_json(201, {
        "id": "j1", "status": "queued", "warnings": [warning],
        "links": {"self": "/v1/jobs/j1", "events": "/v1/jobs/j1/events"}}))
    result = run_cli("submit", program, "--device", "cuda", "--server", server.url)
    assert result.returncode == 0, result.stderr
    assert result.stderr == f"minify-client: warning: {warning}\n"
    assert result.stdout.splitlines()[0] == "j1"


def test_status_shows_the_jobs_warnings(server: ScriptedServer):
    status = job_status("j1", JobState.queued).model_copy(update={"warnings": ["no worker has served cuda"]})
    server.route("GET", "/v1/jobs/j1", lambda e: e.send_json(200, status.model_dump(mode="json")))
    result = run_cli("status", "j1", "--server", server.url)
    assert "warning:   no worker has served cuda" in result.stdout.splitlines()


@pytest.mark.parametrize(("state", "verdict", "row"), [
    (OriginalState.running, None, "original:  running (its verdict follows the delivered result)"),
    (OriginalState.confirmed, None, "original:  confirmed (failed 1 of 3 runs)"),
    (OriginalState.not_reproduced, "passes 3x", "original:  not_reproduced: passes 3x (the result is kept)"),
])
def test_status_shows_where_the_originals_verdict_stands(server: ScriptedServer, state: OriginalState,
                                                         verdict: str | None, row: str):
    status = job_status("j1", JobState.succeeded)
    assert status.result is not None
    status.result = status.result.model_copy(update={"original_state": state, "original_verdict": verdict,
                                                     "original_runs": 3, "original_failures": 1})
    server.route("GET", "/v1/jobs/j1", lambda e: e.send_json(200, status.model_dump(mode="json")))
    result = run_cli("status", "j1", "--server", server.url)
    assert row in result.stdout.splitlines()


def test_status_of_a_report_without_a_verdict_has_no_original_row(server: ScriptedServer):
    serve_finished_job(server, JobState.succeeded)
    assert "original:" not in run_cli("status", "j1", "--server", server.url).stdout


def test_submit_json_prints_the_created_job(server: ScriptedServer, program: Path):
    serve_job(server, job_status("j1", JobState.queued), [])
    result = run_cli("submit", program, "--server", server.url, "--json")
    created = json.loads(result.stdout)
    assert created["id"] == "j1"
    assert created["dashboard"] == f"{server.url}/#/jobs/j1"


def test_submit_sends_the_inputs_file(server: ScriptedServer, program: Path, tmp_path: Path):
    serve_job(server, job_status("j1", JobState.queued), [])
    inputs = tmp_path / "inputs.pt"
    inputs.write_bytes(b"real-inputs")
    assert run_cli("submit", program, "--inputs", inputs, "--server", server.url).returncode == 0
    assert b"real-inputs" in server.requests_to("POST", "/v1/jobs")[0].body


def test_submit_wait_on_a_minimized_job_exits_0_with_artifacts_and_graph(
    server: ScriptedServer, program: Path, tmp_path: Path
):
    serve_finished_job(server, JobState.succeeded)
    out = tmp_path / "repro"
    result = run_cli("submit", program, "--wait", "--out", out, "--server", server.url)

    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted([*ARTIFACTS, "report.json"])
    lines = result.stdout.splitlines()
    assert lines[0] == f"submitted job j1: {server.url}/#/jobs/j1"
    assert "[    1.0s] truncate: 2 → 1 nodes, 4 checks (1 cached)" in lines
    assert "succeeded: 2 → 1 nodes, 5 checks (1 cached) in 1.5s" in lines
    assert GRAPH_CODE in result.stdout
    assert f"reproduce with: python {out / 'repro.py'}" in lines


def test_submit_wait_on_a_not_reproducible_job_exits_3(server: ScriptedServer, program: Path, tmp_path: Path):
    serve_finished_job(server, JobState.not_reproducible, reason="the original program passes")
    result = run_cli("submit", program, "--wait", "--server", server.url, cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    assert "not reproducible: the original program passes" in result.stdout
    assert (tmp_path / "minify-j1" / "report.json").is_file()


@pytest.mark.parametrize("state", [JobState.failed, JobState.cancelled])
def test_submit_wait_on_a_failed_or_cancelled_job_exits_1(
    server: ScriptedServer, program: Path, tmp_path: Path, state: JobState
):
    serve_finished_job(server, state, reason="worker died")
    result = run_cli("submit", program, "--wait", "--server", server.url, cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert f"{state.value}: worker died" in result.stdout


def test_submit_wait_json_keeps_stdout_for_one_json_document(
    server: ScriptedServer, program: Path, tmp_path: Path
):
    serve_finished_job(server, JobState.succeeded)
    result = run_cli("submit", program, "--wait", "--json", "--out", tmp_path / "out", "--server", server.url)
    assert result.returncode == 0
    outcome = json.loads(result.stdout)
    assert outcome["status"] == "succeeded"
    assert outcome["exit_code"] == 0
    assert outcome["report"]["graph_code"] == GRAPH_CODE
    assert Path(outcome["artifacts"]["repro.py"]).read_bytes() == ARTIFACTS["repro.py"]
    assert "truncate: 2 → 1 nodes" in result.stderr


def test_an_interrupted_download_is_one_line_and_exit_1(server: ScriptedServer, program: Path, tmp_path: Path):
    serve_finished_job(server, JobState.succeeded)
    server.route("GET", "/v1/jobs/j1/artifacts/minimized.pt2",
                 lambda e: e.send_truncated(b"x" * 10, announced=1000))
    result = run_cli("submit", program, "--wait", "--out", tmp_path / "out", "--server", server.url,
                     "--retry-for", "0")
    assert result.returncode == 1
    assert result.stderr.startswith("minify-client: error: download of minimized.pt2 interrupted: ")
    assert not (tmp_path / "out" / "minimized.pt2").exists()
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.endswith(".part")]


@contextmanager
def sigint_as_on_a_terminal() -> Iterator[None]:
    """Processes started inside get SIGINT at its default, as a terminal's foreground job has it.

    An ignored signal stays ignored across exec, and a shell script's background job (`make test &`,
    a CI runner's) starts with SIGINT ignored: a client started from it would rightly not hear a
    Ctrl-C. A handler, unlike SIG_IGN, is reset to the default on exec, so one here while the child
    starts gives it the terminal's disposition whatever this process inherited.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def endless_job(server: ScriptedServer) -> None:
    """Job j1 runs and streams one event, then nothing (the stream stays open)."""
    def endless(exchange: Exchange) -> None:
        exchange.start_events()
        exchange.send_event("1", ProgressEvent(type="status", status=JobState.running))
        time.sleep(30)

    serve_job(server, job_status("j1", JobState.running), [])
    server.route("GET", "/v1/jobs/j1/events", endless)


def test_ctrl_c_during_wait_leaves_the_job_running_and_says_how_to_resume(
    server: ScriptedServer, program: Path, tmp_path: Path
):
    endless_job(server)
    out = tmp_path / "out"
    with sigint_as_on_a_terminal():
        process = subprocess.Popen(
            [sys.executable, "-m", "minify_client.cli", "submit", str(program), "--wait", "--out", str(out),
             "--server", server.url],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(None),
        )
    try:
        assert process.stdout is not None
        for line in process.stdout:
            if "status: running" in line:
                break
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 130
    assert f"resume with: minify-client watch j1 --server {server.url} --out {out}" in stderr
    assert server.requests_to("DELETE", "/v1/jobs/j1") == []


def test_ctrl_c_as_the_progress_bar_starts_on_a_terminal_says_how_to_resume_and_shows_the_cursor(
    server: ScriptedServer, program: Path, tmp_path: Path
):
    # On a terminal the client sets up rich's live bar between printing the job's id and following
    # it; a Ctrl-C then used to end the client without naming the job to resume. Sent as soon as
    # the id shows, it lands in that set-up or just after it: the answer must be the same.
    endless_job(server)
    out = tmp_path / "out"
    terminal, client_side = pty.openpty()
    with sigint_as_on_a_terminal():
        process = subprocess.Popen(
            [sys.executable, "-m", "minify_client.cli", "submit", str(program), "--wait", "--out", str(out),
             "--server", server.url],
            stdin=subprocess.DEVNULL, stdout=client_side, stderr=subprocess.PIPE, text=True, env=_env(None),
        )
    os.close(client_side)
    try:
        shown = _read_terminal_until(terminal, lambda shown: b"submitted job j1" in shown)
        process.send_signal(signal.SIGINT)
        # Read on while it exits: a client whose terminal is full would block writing to it.
        shown += _read_terminal_until(terminal, lambda _: process.poll() is not None)
        process.wait(timeout=10)
        stderr = process.stderr.read() if process.stderr else ""
    finally:
        process.kill()
        os.close(terminal)
    assert process.returncode == 130
    assert f"resume with: minify-client watch j1 --server {server.url} --out {out}" in stderr
    hidden = shown.rfind(b"\x1b[?25l")
    assert hidden == -1 or shown.rfind(b"\x1b[?25h") > hidden, "the cursor was left hidden"


def _read_terminal_until(terminal: int, done: Callable[[bytes], bool], timeout_s: float = 30.0) -> bytes:
    """What the client writes to its terminal, until `done(what it wrote)` or the client closes it."""
    shown = b""
    deadline = time.monotonic() + timeout_s
    while not done(shown):
        assert time.monotonic() < deadline, f"still waiting after {timeout_s:.0f} s; the terminal shows {shown!r}"
        ready, _, _ = select.select([terminal], [], [], 0.1)
        if ready:
            try:
                shown += os.read(terminal, 65536)
            except OSError:  # EIO: the client closed its end
                return shown
    return shown


# ---- the other subcommands ---------------------------------------------------------------------


def test_watch_follows_a_job_and_exits_with_its_outcome(server: ScriptedServer, tmp_path: Path):
    serve_finished_job(server, JobState.not_reproducible, reason="passes")
    result = run_cli("watch", "j1", "--server", server.url, cwd=tmp_path)
    assert result.returncode == 3
    assert "status: not_reproducible" in result.stdout
    assert list(tmp_path.iterdir()) == []  # without --out, watch downloads nothing


def test_watch_with_out_downloads_the_artifacts(server: ScriptedServer, tmp_path: Path):
    serve_finished_job(server, JobState.succeeded)
    result = run_cli("watch", "j1", "--out", tmp_path / "out", "--server", server.url)
    assert result.returncode == 0
    assert (tmp_path / "out" / "repro.py").read_bytes() == ARTIFACTS["repro.py"]


def test_status_prints_the_job(server: ScriptedServer):
    serve_finished_job(server, JobState.not_reproducible, reason="passes")
    result = run_cli("status", "j1", "--server", server.url)
    assert result.returncode == 0
    assert "status:    not_reproducible" in result.stdout
    assert "reason:    passes" in result.stdout


def test_status_json_is_the_job_status(server: ScriptedServer):
    serve_finished_job(server, JobState.succeeded)
    result = run_cli("status", "j1", "--json", "--server", server.url)
    assert json.loads(result.stdout)["result"]["graph_code"] == GRAPH_CODE


def test_download_one_named_artifact(server: ScriptedServer, tmp_path: Path):
    serve_finished_job(server, JobState.succeeded)
    result = run_cli("download", "j1", "--name", "repro.py", "--out", tmp_path, "--server", server.url)
    assert result.returncode == 0
    assert result.stdout.strip() == str(tmp_path / "repro.py")
    assert [p.name for p in tmp_path.iterdir()] == ["repro.py"]


def test_cancel_prints_the_new_status(server: ScriptedServer):
    cancelled = job_status("j1", JobState.cancelled)
    server.route("DELETE", "/v1/jobs/j1", lambda e: e.send_json(200, cancelled.model_dump(mode="json")))
    result = run_cli("cancel", "j1", "--server", server.url)
    assert result.returncode == 0
    assert result.stdout == "job j1: cancelled\n"


def test_cancel_of_a_running_job_says_it_is_being_cancelled_not_running(server: ScriptedServer):
    running = job_status("j1", JobState.running)
    server.route("DELETE", "/v1/jobs/j1", lambda e: e.send_json(202, running.model_dump(mode="json")))
    result = run_cli("cancel", "j1", "--server", server.url)
    assert result.returncode == 0
    assert result.stdout.startswith("job j1: cancelling (it was running; it stops within seconds")


def _finished(state: JobState, reason: str | None = None, signature: str | None = None,
              config: dict | None = None, phase: str = "culprit") -> JobStatus:
    status = job_status("j1", state, reason=reason)
    status.progress.phase = phase
    status.spec = status.spec.model_copy(update={"config": config or {}})
    if status.result is not None:
        status.result = status.result.model_copy(update={"signature": signature})
    return status


@pytest.mark.parametrize(("status", "shown", "hidden"), [
    (_finished(JobState.succeeded, signature="CppCompileError: 'tmpN' was not declared in this scope"),
     ["signature: CppCompileError: 'tmpN' was not declared in this scope"], ["phase:", "reason:", "note:"]),
    (_finished(JobState.failed, reason="job timed out"), ["reason:    job timed out"], ["phase:", "signature:"]),
    (_finished(JobState.not_reproducible, reason="the original passes 3 of 3 runs"),
     ["reason:    the original passes 3 of 3 runs"], ["phase:"]),
    (_finished(JobState.succeeded, config={"cpp.inject_relu_bug_TESTING_ONLY": "compile_errr"},
               signature="AssertionError: unrecognized config cpp.inject_relu_bug_TESTING_ONLY = 'compile_errr'"),
     ["note:      torch refused the spec's own setting cpp.inject_relu_bug_TESTING_ONLY='compile_errr': a mistake "
      "in the spec, not a compiler bug"], ["phase:"]),
    (_finished(JobState.running, phase="shrink"), ["phase:     shrink"], ["signature:", "reason:"]),
])
def test_status_leads_with_what_the_job_found_or_why_it_did_not(server: ScriptedServer, status: JobStatus,
                                                                shown: list[str], hidden: list[str]):
    server.route("GET", "/v1/jobs/j1", lambda e: e.send_json(200, status.model_dump(mode="json")))
    result = run_cli("status", "j1", "--server", server.url)
    assert result.returncode == 0, result.stderr
    for line in shown:
        assert line in result.stdout
    for label in hidden:
        assert label not in result.stdout
    labels = [line.split(":")[0] for line in result.stdout.splitlines()]
    assert labels[:2] == ["job", "status"]


def test_list_says_what_each_finished_job_found_or_why_it_did_not(server: ScriptedServer):
    jobs = [_finished(JobState.failed, reason="no worker took it in 600 s\nsecond line"),
            _finished(JobState.succeeded, signature="CppCompileError: 'tmpN' was not declared in this scope"),
            _finished(JobState.not_reproducible, reason="x" * 300), job_status("j4", JobState.running)]
    server.route("GET", "/v1/jobs", lambda e: e.send_json(
        200, {"jobs": [j.model_dump(mode="json") for j in jobs], "total": 4, "offset": 0, "limit": 20}))
    result = run_cli("list", "--server", server.url)
    lines = result.stdout.splitlines()
    assert lines[0].endswith("SIGNATURE OR REASON")
    assert lines[1].endswith("no worker took it in 600 s second line")
    assert lines[2].endswith("CppCompileError: 'tmpN' was not declared in this scope")
    assert lines[3].endswith("x" * 99 + "…")
    assert lines[4].split()[1] == "running" and lines[4].rstrip() == lines[4]


def test_list_into_a_reader_that_stops_early_ends_quietly(server: ScriptedServer):
    jobs = [job_status(f"j{index}", JobState.succeeded) for index in range(400)]
    server.route("GET", "/v1/jobs", lambda e: e.send_json(
        200, {"jobs": [j.model_dump(mode="json") for j in jobs], "total": 400, "offset": 0, "limit": 400}))
    done = subprocess.run(f"{sys.executable} -m minify_client.cli list --limit 400 --server {server.url} | head -2",
                          shell=True, capture_output=True, text=True, timeout=60, env=_env(None))
    assert done.stdout.splitlines()[1].startswith("j0 ")
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_download_and_job_timeout_have_help(server: ScriptedServer):
    download = run_cli("download", "--help").stdout
    submit = run_cli("submit", "--help").stdout
    assert "Download a finished job's artifacts" in download and "the job (as submit printed it)" in download
    assert "--job-timeout SECONDS\n" in submit and "the whole job's limit" in submit


def test_list_prints_a_table_and_filters_by_status(server: ScriptedServer):
    jobs = [job_status("j2", JobState.running), job_status("j1", JobState.succeeded)]
    server.route("GET", "/v1/jobs", lambda e: e.send_json(
        200, {"jobs": [j.model_dump(mode="json") for j in jobs], "total": 7, "offset": 0, "limit": 2}))
    result = run_cli("list", "--status", "running", "--limit", "2", "--server", server.url)
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["ID", "STATUS", "PROGRAM", "NODES", "CHECKS", "CREATED", "SIGNATURE", "OR", "REASON"]
    assert lines[1].split()[:3] == ["j2", "running", "relu_cos.pt2"]
    assert lines[-1] == "(2 of 7 jobs)"
    assert "status=running" in server.requests_to("GET", "/v1/jobs")[0].query


def test_list_rejects_an_unknown_status():
    assert run_cli("list", "--status", "sleeping").returncode == 2


def test_submit_warns_before_uploading_a_program_whose_members_would_run_code(server: ScriptedServer,
                                                                             tmp_path: Path):
    from tests.support.archives import pickled_weight_archive

    marker = tmp_path / "pwned"
    program = pickled_weight_archive(tmp_path, marker)
    serve_job(server, job_status("j1", JobState.queued), [])

    result = run_cli("submit", program, "--server", server.url)

    assert result.returncode == 0, result.stderr
    assert "minify-client: warning: pickled_weight.pt2:" in result.stderr
    assert "data/weights/weight_0" in result.stderr and "MINIFY_ALLOW_PICKLE=1" in result.stderr
    assert not marker.exists()


# ---- mistakes caught before a job exists --------------------------------------------------------


def _serve_config_schema(server: ScriptedServer) -> None:
    from minify_contract.config_schema import ConfigSchema, ConfigSchemas, KeyRule

    schema = ConfigSchema(torch="2.13.0+cpu", keys={
        "cpp.inject_relu_bug_TESTING_ONLY": KeyRule(kinds=["null", "str"],
                                                    choices=["compile_error", "runtime_error", "accuracy", None]),
        "max_autotune": KeyRule(kinds=["bool"])})
    server.route("GET", "/v1/config", lambda e: e.send_json(200, ConfigSchemas(schemas=[schema]).model_dump()))


@pytest.mark.parametrize(("config", "says"), [
    ("cpp.inject_relu_bug_TESTING_ONLY=compile_errr",
     "config cpp.inject_relu_bug_TESTING_ONLY='compile_errr' is not one of 'compile_error', 'runtime_error', "
     "'accuracy', null (torch 2.13.0+cpu)"),
    ("cpp.no_such_key=1", "config key 'cpp.no_such_key' is not a setting of torch 2.13.0+cpu"),
    ("max_autotune=yes", "config max_autotune='yes' is a str; torch 2.13.0+cpu takes bool"),
])
def test_a_config_the_servers_torch_does_not_take_is_refused_before_uploading(server: ScriptedServer, program: Path,
                                                                              config: str, says: str):
    _serve_config_schema(server)
    serve_job(server, job_status("j1", JobState.queued), [])

    result = run_cli("submit", program, "--config", config, "--server", server.url)

    assert result.returncode == 2
    assert result.stderr == f"minify-client: error: the server refused the request (422): {says}\n"
    assert server.requests_to("POST", "/v1/jobs") == []


def test_a_config_the_servers_torch_takes_is_submitted(server: ScriptedServer, program: Path):
    _serve_config_schema(server)
    serve_job(server, job_status("j1", JobState.queued), [])

    result = run_cli("submit", program, "--config", "cpp.inject_relu_bug_TESTING_ONLY=compile_error",
                     "--config", "max_autotune=true", "--server", server.url)

    assert result.returncode == 0, result.stderr
    assert len(server.requests_to("POST", "/v1/jobs")) == 1


def test_submit_captures_of_a_folder_that_does_not_exist_is_a_usage_error(tmp_path: Path):
    result = run_cli("submit-captures", tmp_path / "nonexistent", "--server", closed_port_url())
    assert result.returncode == 2
    assert result.stderr == f"minify-client: error: no such capture directory: {tmp_path / 'nonexistent'}\n"


def test_submit_captures_of_a_folder_with_nothing_captured_is_fine(tmp_path: Path):
    result = run_cli("submit-captures", tmp_path, "--server", closed_port_url())
    assert result.returncode == 0
    assert "no captures in" in result.stderr


def test_submit_captures_records_each_job_in_captures_json(server: ScriptedServer, program: Path, tmp_path: Path):
    captures = tmp_path / "caps"
    entries = []
    for name in ("test_a", "test_b"):
        (captures / name).mkdir(parents=True)
        (captures / name / f"{name}.pt2").write_bytes(program.read_bytes())
        (captures / name / "spec.json").write_text(JobSpec().model_dump_json())
        (captures / name / "inputs.pt").write_bytes(b"inputs")
        entries.append({"name": name, "key": name, "level": "aot", "kind": "compile_error", "backend": "inductor",
                        "signature": "E: x", "chain": [], "program": f"{name}/{name}.pt2",
                        "spec": f"{name}/spec.json", "inputs": f"{name}/inputs.pt", "tests": [f"t.py::{name}"],
                        "job": None, "dashboard": None, "static_reason": None})
    (captures / "captures.json").write_text(json.dumps({"captures": entries}))
    serve_job(server, job_status("j1", JobState.queued), [])

    result = run_cli("submit-captures", captures, "--server", server.url)

    assert result.returncode == 0, result.stderr
    recorded = json.loads((captures / "captures.json").read_text())["captures"]
    assert [(entry["name"], entry["job"]) for entry in recorded] == [("test_a", "j1"), ("test_b", "j1")]
    assert all(entry["dashboard"] == f"{server.url}/#/jobs/j1" for entry in recorded)
