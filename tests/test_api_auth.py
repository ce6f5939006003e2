"""Bearer tokens and the loopback-only default, against the real minify-server."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.service import Service, start_service

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with start_service(tmp_path_factory.mktemp("auth") / "data", workers=0, tokens=[TOKEN, "other"]) as running:
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
