"""Start the real `minify-server` (embedded Redis, real RQ workers) for a test, and stop it cleanly.

    from tests.support.service import start_service

    with start_service(tmp_path / "data", workers=1, tokens=["s3cret"]) as service:
        httpx.get(f"{service.url}/v1/jobs", headers=service.headers)

On exit the server gets SIGTERM (as on Ctrl-C), and the helper checks that no process it started
is left: every descendant carries a marker in its environment, so even orphans are found.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from minify_worker.programs.fx.culprit import MIN_BUDGET_ENV
from minify_worker.sandbox.processes import process_stats

MARKER = "MINIFY_TEST_SERVICE"
# The culprit phase's floor at a second, not the suite's 5 s (tests/conftest.py), for a worker or
# command whose tests read only that the phase ran (it runs after the result, and says its budget
# ran out), not what it found.
CULPRIT_FLOOR = {MIN_BUDGET_ENV: "1"}
# The services tests start allow the test backends: tests/support/backends.py's PREFIX, spelled again
# here because that module imports torch and the bench's harness, which starts services, does not.
TEST_BACKENDS = "tests.support.backends"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def marked_pids(marker: str) -> list[int]:
    """Live processes whose environment holds MINIFY_TEST_SERVICE=<marker>, and their descendants.

    The environment finds orphans (re-parented away from the server); descent finds processes
    that overwrite their environment area with a process title (redis-server does).
    """
    needle = f"{MARKER}={marker}".encode()
    parents: dict[int, int] = {}
    marked: set[int] = set()
    for pid, stat in process_stats():
        if stat[0] == "Z":
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        parents[pid] = int(stat[1])
        if needle in environ.split(b"\0"):
            marked.add(pid)
    grew = True
    while grew:
        children = {pid for pid, parent in parents.items() if parent in marked} - marked
        marked |= children
        grew = bool(children)
    return sorted(marked)


class ServiceError(RuntimeError):
    pass


@dataclass
class Service:
    url: str
    data_dir: Path
    process: subprocess.Popen
    marker: str
    log_path: Path
    tokens: list[str] = field(default_factory=list)

    @property
    def headers(self) -> dict[str, str]:
        """Authorization for the first token (empty without tokens)."""
        return {"Authorization": f"Bearer {self.tokens[0]}"} if self.tokens else {}

    def client(self, **kwargs: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=30, **kwargs)

    @property
    def redis_url(self) -> str:
        """The embedded Redis, for a worker started by the test (`minify-worker --redis-url`)."""
        return (self.data_dir / "redis" / "redis.url").read_text().strip()

    def pids(self) -> list[int]:
        """Every live process of this service: server, Redis, workers, work horses, sandbox children."""
        return marked_pids(self.marker)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGTERM the server, wait for it, then fail if any process it started is still alive."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._kill_all()
                raise ServiceError(f"minify-server did not stop in {timeout_s:.0f} s\n{self.log()[-4000:]}") from None
        deadline = time.monotonic() + 10
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        left = self.pids()
        if left:
            described = [_describe(pid) for pid in left]
            self._kill_all()
            raise ServiceError(f"processes left after minify-server stopped: {described}")

    def _kill_all(self) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _describe(pid: int) -> str:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return str(pid)
    return f"{pid}: {command[:200]}"


def wait_healthy(url: str, workers: int, process: subprocess.Popen, timeout_s: float) -> None:
    """Poll /healthz until the server counts `workers` workers. One client for the whole wait: each
    `httpx.get` builds a client, and its TLS context (the CA bundle read again, 17 ms of CPU here),
    ten times a second for the seconds a worker takes to import torch."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    with httpx.Client(timeout=2) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise ServiceError(f"minify-server exited with {process.returncode}")
            try:
                response = client.get(f"{url}/healthz")
                body = response.json()
                if response.status_code == 200 and body.get("workers", 0) >= workers:
                    return
                last = response.text
            except (httpx.HTTPError, ValueError) as error:
                last = repr(error)
            time.sleep(0.1)
    raise ServiceError(f"minify-server not healthy after {timeout_s:.0f} s: {last}")


def limit_file_size(limit_bytes: int) -> Callable[[], None]:
    """A `preexec_fn`: RLIMIT_FSIZE for the child and its descendants, a write past it failing with EFBIG
    (SIGXFSZ ignored, as it stays across exec) instead of killing the writer: a real full disk for
    files over `limit_bytes`, no mount needed."""

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return limit


@contextmanager
def start_service(data_dir: Path, *, env: dict[str, str] | None = None, workers: int = 1,
                  tokens: list[str] | None = None, args: list[str] | None = None,
                  timeout_s: float = 240.0, file_size_limit: int | None = None,
                  warm_up: bool = False) -> Iterator[Service]:
    """The real `minify-server` on a free port with an embedded Redis in `data_dir` and `workers` workers.

    A worker counts once it has registered, after its preload (torch and inductor imports, and on a
    machine whose compile cache is still empty, inductor's first compile: tens of seconds).

    `env` adds to (or overrides) the environment; the test backends are allowed by default.
    `warm_up`: the workers run inductor's CPU warm-up at start, as they do by default; the tests
    leave it out (`MINIFY_WORKER_WARM_UP=0`, about 2 s of CPU per worker) unless their jobs
    compile with real inductor.
    `file_size_limit` (bytes) is the largest file the server and every process it starts may write
    (`limit_file_size`): a disk that is full for larger files.
    Yields a Service; stops it on exit and fails if any of its processes is left.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    marker = uuid.uuid4().hex
    full_env = {**os.environ, "MINIFY_ALLOWED_BACKENDS": TEST_BACKENDS,
                "MINIFY_WORKER_WARM_UP": "1" if warm_up else "0", **(env or {}), MARKER: marker}
    full_env.pop("MINIFY_REDIS_URL", None)
    if tokens:
        full_env["MINIFY_TOKENS"] = ",".join(tokens)
    log_path = data_dir / f"server-{port}.log"
    command = [sys.executable, "-c", "import sys; from minify_server.cli import main; sys.exit(main())",
               "--data-dir", str(data_dir), "--port", str(port), "--workers", str(workers), *(args or [])]
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(command, env=full_env, stdout=log_file, stderr=subprocess.STDOUT,
                                   preexec_fn=limit_file_size(file_size_limit) if file_size_limit else None)
    service = Service(url=f"http://127.0.0.1:{port}", data_dir=data_dir, process=process, marker=marker,
                      log_path=log_path, tokens=list(tokens or []))
    try:
        wait_healthy(service.url, workers, process, timeout_s)
    except BaseException as error:
        service._kill_all()
        process.wait()
        raise ServiceError(f"{error}\n--- server log ---\n{service.log()[-4000:]}") from error
    try:
        yield service
    finally:
        service.stop()


@dataclass(frozen=True)
class SseEvent:
    id: str
    event: str
    data: dict


def read_events(client: httpx.Client, job_id: str, last_event_id: str | None = None,
                timeout_s: float = 120.0) -> list[SseEvent]:
    """All Server-Sent Events of a job, from the first (or after `last_event_id`) until the stream ends."""
    import json

    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    events: list[SseEvent] = []
    frame: dict[str, str] = {}
    with client.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers, timeout=timeout_s) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line:
                name, _, value = line.partition(":")
                frame[name] = value.removeprefix(" ")
                continue
            if "data" in frame:
                events.append(SseEvent(frame.get("id", ""), frame.get("event", "message"), json.loads(frame["data"])))
            frame = {}
    return events


def wait_for_status(client: httpx.Client, job_id: str, statuses: set[str], timeout_s: float = 120.0) -> dict:
    """Poll GET /v1/jobs/{id} until its status is one of `statuses`; returns the JobStatus JSON."""
    deadline = time.monotonic() + timeout_s
    while True:
        body = client.get(f"/v1/jobs/{job_id}").json()
        if body["status"] in statuses:
            return body
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still {body['status']} after {timeout_s:.0f} s: {body}")
        time.sleep(0.1)


def wait_for_culprit(client: httpx.Client, job_id: str, timeout_s: float = 120.0) -> dict:
    """Poll GET /v1/jobs/{id} until its culprit phase (which follows a succeeded job's delivered
    result) is no longer running; returns the JobStatus JSON."""
    deadline = time.monotonic() + timeout_s
    while True:
        body = client.get(f"/v1/jobs/{job_id}").json()
        if body.get("culprit_state") != "running" and body["status"] not in ("queued", "running"):
            return body
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id}'s culprit still running after {timeout_s:.0f} s: {body}")
        time.sleep(0.1)
