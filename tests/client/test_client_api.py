"""The Python API (`minify_client.Client`) against a scripted HTTP server on a loopback port."""

from __future__ import annotations

from pathlib import Path

import pytest

from minify_client import (
    ApiError,
    BadRequest,
    Client,
    Conflict,
    ConnectionFailed,
    DownloadInterrupted,
    JobSpec,
    JobState,
    NotFound,
    ProgressEvent,
    ServerError,
    Unauthorized,
)
from minify_client._sse import parse_events
from tests.support.scripted_server import (
    Exchange,
    ScriptedServer,
    closed_port_url,
    job_status,
    minimizing_events,
    serve_job,
)


@pytest.fixture
def server():
    with ScriptedServer() as scripted:
        yield scripted


def test_submit_posts_program_spec_and_inputs_with_the_bearer_token(server: ScriptedServer, tmp_path: Path):
    serve_job(server, job_status("j1", JobState.queued), [])
    program = tmp_path / "relu.pt2"
    program.write_bytes(b"PK-program")
    inputs = tmp_path / "inputs.pt"
    inputs.write_bytes(b"inputs")
    spec = JobSpec(config={"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"})

    with Client(server.url, "s3cret") as client:
        created = client.submit(program, spec, inputs=inputs)

    assert created.id == "j1"
    (request,) = server.requests_to("POST", "/v1/jobs")
    assert request.headers["authorization"] == "Bearer s3cret"
    body = request.body
    assert b'name="program"; filename="relu.pt2"' in body and b"PK-program" in body
    assert b'name="inputs"; filename="inputs.pt"' in body
    spec_json = body.split(b'name="spec"\r\n\r\n')[1].split(b"\r\n--")[0]
    assert JobSpec.model_validate_json(spec_json) == spec


def test_server_and_token_default_to_the_environment(monkeypatch: pytest.MonkeyPatch, server: ScriptedServer):
    monkeypatch.setenv("MINIFY_SERVER", server.url + "/")
    monkeypatch.setenv("MINIFY_TOKEN", "from-env")
    serve_job(server, job_status("j1", JobState.queued), [])
    with Client() as client:
        assert client.server == server.url
        client.status("j1")
    assert server.requests_to("GET", "/v1/jobs/j1")[0].headers["authorization"] == "Bearer from-env"


def test_without_a_token_no_authorization_header_is_sent(monkeypatch: pytest.MonkeyPatch, server: ScriptedServer):
    monkeypatch.delenv("MINIFY_TOKEN", raising=False)
    serve_job(server, job_status("j1", JobState.queued), [])
    with Client(server.url) as client:
        client.status("j1")
    assert "authorization" not in server.requests_to("GET", "/v1/jobs/j1")[0].headers


@pytest.mark.parametrize(
    ("status_code", "body", "error_type", "message"),
    [
        (401, {"error": "missing bearer token"}, Unauthorized, "missing bearer token"),
        (403, {"detail": "token not accepted"}, Unauthorized, "token not accepted"),
        (404, {"error": "no job j9"}, NotFound, "no job j9"),
        (413, {"error": "upload over 2 GiB"}, BadRequest, "upload over 2 GiB"),
        (422, {"detail": [{"loc": ["body", "spec"], "msg": "invalid backend"}]}, BadRequest,
         "body.spec: invalid backend"),
        (500, "Internal Server Error", ServerError, "Internal Server Error"),
    ],
)
def test_error_statuses_raise_the_matching_api_error_with_the_server_message(
    server: ScriptedServer, status_code: int, body: object, error_type: type[ApiError], message: str
):
    def answer(exchange: Exchange) -> None:
        if isinstance(body, str):
            exchange.send_bytes(status_code, body.encode(), "text/plain")
        else:
            exchange.send_json(status_code, body)

    server.route("GET", "/v1/jobs/j9", answer)
    with Client(server.url) as client, pytest.raises(error_type) as caught:
        client.status("j9")
    assert caught.value.status_code == status_code
    assert caught.value.message == message


def test_a_closed_port_raises_connection_failed_naming_the_server():
    url = closed_port_url()
    with Client(url, retry_for_s=0) as client, pytest.raises(ConnectionFailed) as caught:
        client.status("j1")
    assert str(caught.value).startswith(f"cannot reach minify server at {url}: ")


def test_list_passes_the_status_filter(server: ScriptedServer):
    job = job_status("j1", JobState.running)
    server.route("GET", "/v1/jobs", lambda e: e.send_json(
        200, {"jobs": [job.model_dump(mode="json")], "total": 1, "offset": 0, "limit": 50}))
    with Client(server.url) as client:
        listed = client.list("running")
    assert [j.id for j in listed.jobs] == ["j1"]
    assert "status=running" in server.requests_to("GET", "/v1/jobs")[0].query


def test_cancel_sends_delete_and_returns_the_status(server: ScriptedServer):
    cancelled = job_status("j1", JobState.cancelled)
    server.route("DELETE", "/v1/jobs/j1", lambda e: e.send_json(200, cancelled.model_dump(mode="json")))
    with Client(server.url) as client:
        assert client.cancel("j1").status == JobState.cancelled


def test_dashboard_url_resolves_the_servers_relative_link(server: ScriptedServer):
    with Client(server.url) as client:
        assert client.dashboard_url(job_status("j1", JobState.queued)) == f"{server.url}/#/jobs/j1"


def test_sse_parser_joins_data_lines_keeps_ids_and_skips_comments():
    lines = [": ping", "id: 7", "event: log", "data: a", "data: b", "", "data: x", "", "id: 8", ""]
    events = list(parse_events(lines))
    assert [(e.event, e.data, e.id) for e in events] == [("log", "a\nb", "7"), ("message", "x", "7")]


def test_events_are_yielded_in_order_until_the_final_status(server: ScriptedServer):
    serve_job(server, job_status("j1", JobState.succeeded), minimizing_events(JobState.succeeded))
    with Client(server.url) as client:
        events = list(client.events("j1"))
    assert events == minimizing_events(JobState.succeeded)


def test_events_the_client_does_not_understand_are_skipped(server: ScriptedServer):
    def stream(exchange: Exchange) -> None:
        exchange.start_events()
        exchange.send_raw("event: hello\ndata: not json\n\n")
        exchange.send_raw('event: metrics\ndata: {"type": "metrics", "cpu": 3}\n\n')
        exchange.send_event("1", ProgressEvent(type="status", status=JobState.failed))

    server.route("GET", "/v1/jobs/j1/events", stream)
    with Client(server.url) as client:
        assert [e.status for e in client.events("j1")] == [JobState.failed]


def test_a_dropped_stream_is_resumed_with_last_event_id(server: ScriptedServer):
    events = minimizing_events(JobState.succeeded)

    def stream(exchange: Exchange) -> None:
        exchange.start_events()
        after = int(exchange.headers.get("last-event-id", "0"))
        # The first connection drops after two events; the second sends the rest.
        upto = 2 if after == 0 else len(events)
        for number in range(after + 1, upto + 1):
            exchange.send_event(str(number), events[number - 1])

    server.route("GET", "/v1/jobs/j1/events", stream)
    server.route("GET", "/v1/jobs/j1", lambda e: e.send_json(
        200, job_status("j1", JobState.running).model_dump(mode="json")))
    with Client(server.url) as client:
        received = list(client.events("j1"))

    assert received == events
    connections = server.requests_to("GET", "/v1/jobs/j1/events")
    assert [c.headers.get("last-event-id") for c in connections] == [None, "2"]


def test_wait_reports_each_event_and_returns_the_final_status(server: ScriptedServer):
    serve_job(server, job_status("j1", JobState.not_reproducible, reason="the original passes"),
              minimizing_events(JobState.not_reproducible))
    seen: list[ProgressEvent] = []
    with Client(server.url) as client:
        final = client.wait("j1", on_event=seen.append)
    assert final.status == JobState.not_reproducible
    assert final.reason == "the original passes"
    assert seen == minimizing_events(JobState.not_reproducible)


def test_download_writes_the_listed_artifacts(server: ScriptedServer, tmp_path: Path):
    files = {"minimized.pt2": b"pt2", "repro.py": b"print()", "report.json": b"{}"}
    serve_job(server, job_status("j1", JobState.succeeded, artifacts=[*files, "bundle.tar.gz"]), [], files)
    with Client(server.url) as client:
        paths = client.download("j1", tmp_path / "out")
    assert set(paths) == set(files)  # the bundle repeats the others; it is fetched only by name
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == files


def test_download_without_a_listing_fetches_what_exists(server: ScriptedServer, tmp_path: Path):
    status = job_status("j1", JobState.not_reproducible).model_copy(update={"links": None, "result": None})
    serve_job(server, status, [], {"report.json": b"{}"})
    with Client(server.url) as client:
        assert list(client.download("j1", tmp_path)) == ["report.json"]


def test_download_of_a_missing_named_artifact_raises_not_found(server: ScriptedServer, tmp_path: Path):
    serve_job(server, job_status("j1", JobState.succeeded, artifacts=["repro.py"]), [])
    with Client(server.url) as client, pytest.raises(NotFound):
        client.download_artifact("j1", "bundle.tar.gz", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_download_raises_and_leaves_no_file(server: ScriptedServer, tmp_path: Path):
    serve_job(server, job_status("j1", JobState.succeeded, artifacts=["minimized.pt2"]), [])
    server.route("GET", "/v1/jobs/j1/artifacts/minimized.pt2",
                 lambda e: e.send_truncated(b"x" * 100, announced=10_000))
    (tmp_path / "minimized.pt2").write_bytes(b"previous")
    with Client(server.url, retry_for_s=0) as client, pytest.raises(DownloadInterrupted) as caught:
        client.download("j1", tmp_path)
    assert caught.value.name == "minimized.pt2"
    assert [p.name for p in tmp_path.iterdir()] == ["minimized.pt2"]
    assert (tmp_path / "minimized.pt2").read_bytes() == b"previous"


def test_an_unexpected_answer_is_an_api_error_not_a_validation_traceback(server: ScriptedServer):
    server.route("GET", "/v1/jobs/j1", lambda e: e.send_json(200, {"hello": "world"}))
    with Client(server.url) as client, pytest.raises(ApiError) as caught:
        client.status("j1")
    assert "unexpected answer to GET /v1/jobs/j1" in caught.value.message


def test_submit_accepts_a_dict_spec_and_refuses_an_invalid_one_before_sending(
    server: ScriptedServer, tmp_path: Path
):
    serve_job(server, job_status("j1", JobState.queued), [])
    program = tmp_path / "p.pt2"
    program.write_bytes(b"x")
    with Client(server.url) as client:
        client.submit(program, {"backend": "eager"})
        with pytest.raises(ValueError):
            client.submit(program, {"backend": "not a backend"})
    sent = server.requests_to("POST", "/v1/jobs")
    assert len(sent) == 1
    assert b'"backend":"eager"' in sent[0].body.replace(b" ", b"")


def test_download_of_a_running_job_is_a_conflict_before_any_file_is_asked_for(
    server: ScriptedServer, tmp_path: Path
):
    serve_job(server, job_status("j1", JobState.running), [])
    with Client(server.url) as client, pytest.raises(Conflict) as caught:
        client.download("j1", tmp_path)
    assert caught.value.message == "job j1 is running; artifacts appear when it ends"
    assert [e.path for e in server.exchanges] == ["/v1/jobs/j1"]
