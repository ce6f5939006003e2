"""A scripted HTTP server for the client's tests.

It is a real server on a loopback port, answering the routes a test scripts, so the client's real
HTTP stack meets what a real minify server cannot be made to do on demand: a stream that drops
mid-way, a download cut short, a 500. End-to-end tests against the real service live in
test_client_e2e.py.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from minify_contract.models import JobLinks, JobSpec, JobState, JobStatus, ProgressEvent, Report

Handler = Callable[["Exchange"], None]


@dataclass
class Exchange:
    """One request as the scripted server saw it, and the means to answer it."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    handler: BaseHTTPRequestHandler = field(repr=False)

    def send_json(self, status: int, data: Any, headers: dict[str, str] | None = None) -> None:
        self.send_bytes(status, json.dumps(data).encode(), "application/json", headers)

    def send_bytes(self, status: int, body: bytes, content_type: str = "application/octet-stream",
                   headers: dict[str, str] | None = None) -> None:
        self.handler.send_response(status)
        self.handler.send_header("Content-Type", content_type)
        for name, value in (headers or {}).items():
            self.handler.send_header(name, value)
        self.handler.send_header("Content-Length", str(len(body)))
        self.handler.end_headers()
        self.handler.wfile.write(body)

    def send_truncated(self, body: bytes, announced: int) -> None:
        """Announce `announced` bytes, send `body`, then drop the connection."""
        self.handler.send_response(200)
        self.handler.send_header("Content-Type", "application/octet-stream")
        self.handler.send_header("Content-Length", str(announced))
        self.handler.end_headers()
        self.handler.wfile.write(body)
        self.handler.wfile.flush()
        self.handler.close_connection = True

    def drop(self) -> None:
        """Close the connection without an answer, as a server that dies mid-request does."""
        self.handler.close_connection = True

    def start_events(self) -> None:
        self.handler.send_response(200)
        self.handler.send_header("Content-Type", "text/event-stream")
        self.handler.send_header("Cache-Control", "no-cache")
        self.handler.end_headers()

    def send_event(self, event_id: str, event: ProgressEvent) -> None:
        self.send_raw(f"id: {event_id}\nevent: {event.type}\ndata: {event.model_dump_json(exclude_none=True)}\n\n")

    def send_raw(self, text: str) -> None:
        self.handler.wfile.write(text.encode())
        self.handler.wfile.flush()


class ScriptedServer:
    """`with ScriptedServer() as server: server.route("GET", "/v1/jobs/j1", handler)`; on a free
    loopback port, or on `port`."""

    def __init__(self, port: int = 0) -> None:
        self.routes: dict[tuple[str, str], Handler] = {}
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        scripted = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _dispatch(self) -> None:
                path, _, query = self.path.partition("?")
                length = int(self.headers.get("Content-Length") or 0)
                exchange = Exchange(
                    method=self.command, path=path, query=query,
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=self.rfile.read(length) if length else b"", handler=self,
                )
                with scripted._lock:
                    scripted.exchanges.append(exchange)
                route = scripted.routes.get((self.command, path))
                if route is None:
                    exchange.send_json(404, {"error": f"no route {self.command} {path}"})
                    return
                try:
                    route(exchange)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_POST = do_DELETE = _dispatch

        self._server = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    def route(self, method: str, path: str, handler: Handler) -> None:
        self.routes[(method, path)] = handler

    def requests_to(self, method: str, path: str) -> list[Exchange]:
        with self._lock:
            return [e for e in self.exchanges if e.method == method and e.path == path]

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def closed_port() -> int:
    """A loopback port where nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def closed_port_url() -> str:
    """A loopback URL where nothing listens."""
    return f"http://127.0.0.1:{closed_port()}"


def job_status(
    job_id: str,
    state: JobState,
    *,
    artifacts: Iterable[str] = (),
    reason: str | None = None,
    graph_code: str | None = None,
) -> JobStatus:
    names = list(artifacts)
    report = None
    if state.finished and state != JobState.cancelled:
        report = Report(
            status=state, reason=reason, nodes_original=2, nodes_final=1, checks_total=5, checks_cached=1,
            elapsed_s=1.5, backend="inductor", device="cpu", graph_code=graph_code, artifacts=names,
        )
    return JobStatus(
        id=job_id, status=state, spec=JobSpec(), created_at=datetime(2026, 1, 1, tzinfo=timezone.utc),
        result=report, reason=reason, program_name="relu_cos.pt2",
        links=JobLinks(
            self=f"/v1/jobs/{job_id}", events=f"/v1/jobs/{job_id}/events",
            artifacts={name: f"/v1/jobs/{job_id}/artifacts/{name}" for name in names},
            dashboard=f"/#/jobs/{job_id}",
        ),
    )


def serve_job(server: ScriptedServer, status: JobStatus, events: list[ProgressEvent],
              files: dict[str, bytes] | None = None) -> None:
    """Script a job that streams `events` then ends as `status`, with these artifact bytes."""
    job_id = status.id

    def created(exchange: Exchange) -> None:
        exchange.send_json(201, {"id": job_id, "status": "queued",
                                 "links": status.links.model_dump(mode="json") if status.links else {}})

    def stream(exchange: Exchange) -> None:
        exchange.start_events()
        exchange.send_raw(": ping\n\n")
        for number, event in enumerate(events, start=1):
            exchange.send_event(str(number), event)

    server.route("POST", "/v1/jobs", created)
    server.route("GET", f"/v1/jobs/{job_id}", lambda e: e.send_json(200, status.model_dump(mode="json")))
    server.route("GET", f"/v1/jobs/{job_id}/events", stream)
    for name, body in (files or {}).items():
        server.route("GET", f"/v1/jobs/{job_id}/artifacts/{name}",
                     lambda e, body=body: e.send_bytes(200, body))


def minimizing_events(final: JobState) -> list[ProgressEvent]:
    """What a short job streams: running, two shrinking steps, a log line, the final status."""
    return [
        ProgressEvent(type="status", status=JobState.running),
        ProgressEvent(phase="original", nodes_original=2, nodes_current=2, elapsed_s=0.5),
        ProgressEvent(phase="truncate", nodes_original=2, nodes_current=1, checks_total=4,
                      checks_cached=1, elapsed_s=1.0),
        ProgressEvent(type="log", message="kept relu"),
        ProgressEvent(type="status", status=final),
    ]
