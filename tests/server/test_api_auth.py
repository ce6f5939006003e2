"""Bearer tokens and the loopback-only default, against the real minify-server."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest
import redis

from tests.support.service import Service, start_service

TOKEN = "s3cret-token"
ALICE = "alices-token"  # MINIFY_TOKENS names it: alice:alices-token


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with start_service(tmp_path_factory.mktemp("auth") / "data", workers=0,
                       tokens=[TOKEN, "other", f"alice:{ALICE}"]) as running:
        yield running


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/jobs/0123456789abcdef0123456789abcdef",
                                  "/v1/jobs/0123456789abcdef0123456789abcdef/events"])
def test_v1_routes_without_a_token_are_401_json(service: Service, path: str) -> None:
    response = httpx.get(f"{service.url}{path}")
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert "missing token" in response.json()["error"]


def test_a_wrong_token_is_401(service: Service) -> None:
    response = httpx.get(f"{service.url}/v1/jobs", headers={"Authorization": "Bearer nope"})
    assert response.status_code == 401 and response.json()["error"] == "invalid token"


def test_submit_without_a_token_is_401_before_reading_the_upload(service: Service) -> None:
    response = httpx.post(f"{service.url}/v1/jobs", files={"program": ("p.pt2", b"x"), "spec": (None, "{}")})
    assert response.status_code == 401


def test_any_configured_token_is_accepted(service: Service) -> None:
    for token in (TOKEN, "other"):
        response = httpx.get(f"{service.url}/v1/jobs", headers={"Authorization": f"Bearer {token}"})
        assert response.status_code == 200


def test_query_token_is_accepted_for_event_streams(service: Service) -> None:
    response = httpx.get(f"{service.url}/v1/jobs/0123456789abcdef0123456789abcdef/events", params={"token": TOKEN})
    assert response.status_code == 404  # past authentication: the job does not exist


def test_health_metrics_and_dashboard_stay_open(service: Service) -> None:
    for path in ("/healthz", "/", "/metrics"):
        assert httpx.get(f"{service.url}{path}").status_code == 200


def test_server_refuses_a_public_host_without_tokens(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from minify_server.cli import main; sys.exit(main())",
         "--host", "0.0.0.0", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2
    assert "refusing to listen on 0.0.0.0 without authentication" in result.stderr


def test_who_closes_a_bug_is_the_tokens_name_not_the_name_the_request_claims(service: Service) -> None:
    store = redis.Redis.from_url(service.redis_url, decode_responses=True)
    bug = "ab" * 12  # filed as a worker files one (ledger.add_to_bug_index), without running a job
    seen = datetime.now(timezone.utc)
    store.hset(f"minify:bug:{bug}", mapping={"id": bug, "signature": "RuntimeError: x", "representative": "0" * 32,
                                             "first_seen": seen.isoformat(), "last_seen": seen.isoformat()})
    store.zadd("minify:bugs", {bug: seen.timestamp()})
    as_alice = {"Authorization": f"Bearer {ALICE}"}

    closed = httpx.post(f"{service.url}/v1/bugs/{bug}/close", headers=as_alice,
                        json={"reason": "fixed upstream", "by": "mallory"})
    reopened = httpx.post(f"{service.url}/v1/bugs/{bug}/reopen", headers=service.headers, json={"reason": "not yet"})
    anonymous = httpx.post(f"{service.url}/v1/bugs/{bug}/close", json={"reason": "no token"})

    assert closed.status_code == 200 and closed.json()["closure"]["by"] == "alice"
    assert reopened.status_code == 200 and reopened.json()["history"][-1]["by"] == "token 1"  # unnamed: its place
    assert anonymous.status_code == 401
