"""The client rides out a server that is briefly away (a restart, a deploy, a proxy's 503), for a
bounded time, and never creates a job twice. Against a scripted server on a loopback port; the
real server stopped and restarted mid-wait is in test_client_outage.py."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from minify_client import Client, ConnectionFailed, JobState, ServerError
from tests.support.scripted_server import (  # fixtures server and program: tests/conftest.py
    Exchange,
    Handler,
    ScriptedServer,
    closed_port,
    closed_port_url,
    job_status,
    serve_job,
)


def answers(*handlers: Handler) -> Handler:
    """A route handler that answers the n-th request with the n-th handler (the last one repeats)."""
    remaining = list(handlers)

    def handle(exchange: Exchange) -> None:
        (remaining.pop(0) if len(remaining) > 1 else remaining[0])(exchange)

    return handle


def unavailable(retry_after: str | None = None) -> Handler:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return lambda e: e.send_json(503, {"error": "redis is restarting"}, headers)


def test_a_503_is_retried_after_the_delay_its_retry_after_asks(server: ScriptedServer):
    running = job_status("j1", JobState.running).model_dump(mode="json")
    server.route("GET", "/v1/jobs/j1", answers(unavailable("1"), lambda e: e.send_json(200, running)))
    said: list[str] = []
    started = time.monotonic()
    with Client(server.url, retry_for_s=30, on_retry=said.append) as client:
        assert client.status("j1").status == JobState.running
    assert time.monotonic() - started >= 1.0
    assert len(server.requests_to("GET", "/v1/jobs/j1")) == 2
    assert said == ["server unavailable (it answered 503: redis is restarting), retrying for up to 30 s ...",
                    "server reachable again after 1 s"]


def test_the_client_gives_up_after_retry_for_seconds_saying_so():
    url = closed_port_url()
    said: list[str] = []
    started = time.monotonic()
    with Client(url, retry_for_s=1.5, on_retry=said.append) as client, pytest.raises(ConnectionFailed) as caught:
        client.status("j1")
    assert 1.5 <= time.monotonic() - started < 5
    assert said[0].startswith("server unreachable (") and said[0].endswith("retrying for up to 1.5 s ...")
    assert str(caught.value).startswith(f"cannot reach minify server at {url}: ")
    assert str(caught.value).endswith("(gave up after retrying for 1.5 s)")


def test_retry_for_defaults_to_minify_retry_for(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MINIFY_RETRY_FOR", "42")
    with Client("http://127.0.0.1:1") as client:
        assert client.retry_for_s == 42


def test_a_submission_is_sent_once_the_server_listens(program: Path):
    port = closed_port()
    servers: list[ScriptedServer] = []

    def start_later() -> None:
        time.sleep(1.0)
        scripted = ScriptedServer(port).__enter__()
        serve_job(scripted, job_status("j1", JobState.queued), [])
        servers.append(scripted)

    starter = threading.Thread(target=start_later)
    starter.start()
    try:
        with Client(f"http://127.0.0.1:{port}", retry_for_s=30, on_retry=lambda _: None) as client:
            created = client.submit(program, {"backend": "eager"})
    finally:
        starter.join()
        for scripted in servers:
            scripted.__exit__(None, None, None)
    assert created.id == "j1"
    assert len(servers[0].requests_to("POST", "/v1/jobs")) == 1


@pytest.mark.parametrize("answer", [unavailable("0"), Exchange.drop], ids=["503", "dropped"])
def test_a_submission_the_server_may_have_received_is_never_sent_twice(server: ScriptedServer, program: Path,
                                                                      answer: Handler):
    server.route("POST", "/v1/jobs", answer)
    with Client(server.url, retry_for_s=30) as client, pytest.raises((ServerError, ConnectionFailed)):
        client.submit(program)
    assert len(server.requests_to("POST", "/v1/jobs")) == 1


def test_an_interrupted_download_is_fetched_again_whole(server: ScriptedServer, tmp_path: Path):
    serve_job(server, job_status("j1", JobState.succeeded, artifacts=["minimized.pt2"]), [])
    server.route("GET", "/v1/jobs/j1/artifacts/minimized.pt2", answers(
        lambda e: e.send_truncated(b"x" * 10, announced=100), lambda e: e.send_bytes(200, b"x" * 100)))
    with Client(server.url, retry_for_s=30, on_retry=lambda _: None) as client:
        paths = client.download("j1", tmp_path)
    assert paths["minimized.pt2"].read_bytes() == b"x" * 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["minimized.pt2"]
