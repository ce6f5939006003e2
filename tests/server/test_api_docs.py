"""/docs (Swagger UI) and /redoc (ReDoc) work on an offline machine: every file they load is served
by minify itself from the package (static/vendor/), checked against the real server and, where
Chromium is installed, by rendering the pages with every other host unreachable."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import pytest

from tests.support.browser import LAPTOP, launched_browser, needs_chromium, watch_for_errors
from tests.support.service import Service, start_service

DOCS_PAGES = ("/docs", "/redoc")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with start_service(tmp_path_factory.mktemp("minify-data"), workers=0) as running:
        yield running


def referenced_urls(html: str) -> list[str]:
    """The URLs a page's markup loads: src= and href= attributes, and the OpenAPI schema it fetches."""
    return re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", html) + re.findall(
        r"""(?:url:|spec-url=)\s*["']([^"']+)["']""", html)


@pytest.mark.parametrize("path", DOCS_PAGES)
def test_a_docs_page_loads_only_files_the_server_serves(service: Service, path: str) -> None:
    with service.client() as client:
        page = client.get(path)
        assert page.status_code == 200
        assert "default-src 'self'" in page.headers["content-security-policy"]
        urls = referenced_urls(page.text)
        assert urls, f"{path} references nothing"
        assert [url for url in urls if re.match(r"(?:[a-z]+:)?//", url)] == [], f"{path} loads from another host"
        for url in urls:
            response = client.get(urljoin(f"{service.url}{path}", url))
            assert response.status_code == 200, f"{path}: {url} answers {response.status_code}"
            assert response.content, f"{path}: {url} is empty"


def test_the_vendored_files_ship_with_their_licences() -> None:
    vendor = Path(__file__).resolve().parents[2] / "server" / "minify_server" / "static" / "vendor"
    assert "Apache License" in (vendor / "swagger-ui" / "LICENSE").read_text()
    assert "MIT License" in (vendor / "redoc" / "LICENSE").read_text()


@pytest.mark.browser
@needs_chromium
@pytest.mark.parametrize(("path", "operation"), [
    ("/docs", "#operations-jobs-create_job_v1_jobs_post"),
    ("/redoc", "[data-section-id^='tag/jobs/operation/create_job']"),
])
def test_a_docs_page_renders_the_operations_with_no_other_host_reachable(
        service: Service, path: str, operation: str) -> None:
    with launched_browser() as browser:
        page = browser.new_page(viewport=LAPTOP)
        errors = watch_for_errors(page)
        elsewhere: list[str] = []

        def only_the_service(route: Any) -> None:
            if route.request.url.startswith(service.url):
                route.continue_()
            else:
                elsewhere.append(route.request.url)
                route.abort()

        page.route("**/*", only_the_service)
        page.goto(f"{service.url}{path}")
        page.wait_for_selector(operation, timeout=30_000)
        assert elsewhere == []
        # The page's policy refuses what would leave the server (ReDoc's logo), before any request.
        assert [error for error in errors if "Content Security Policy" not in error] == []

