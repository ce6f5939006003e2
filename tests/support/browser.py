"""Helpers for the dashboard's browser tests.

Headless Debian Chromium driven by Playwright (never a downloaded browser), a plain static file
server for tests of the page's own modules, and the folder screenshots go to.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
STATIC_DIR = REPO / "server" / "minify_server" / "static"
CHROMIUM = Path(os.environ.get("MINIFY_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
SCREENSHOTS_DIR = Path(os.environ.get("MINIFY_SCREENSHOTS", REPO / "test-artifacts" / "screenshots"))
LAPTOP = {"width": 1366, "height": 900}
PHONE = {"width": 390, "height": 844}

needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM} (apt-get install chromium, or `make browser`)"
)


@contextlib.contextmanager
def launched_browser() -> Iterator[Any]:
    """A headless Chromium; a Playwright `Browser`."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def watch_for_errors(page: Any) -> list[str]:
    """Uncaught exceptions and console errors of `page`, collected as they happen."""
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(f"uncaught: {error}"))
    page.on("console", lambda message: errors.append(f"console: {message.text}") if message.type == "error" else None)
    return errors


class _StaticHandler(SimpleHTTPRequestHandler):
    """Serves the package folder so that `/` is the dashboard and `/static/...` its files, as the service does."""

    def translate_path(self, path: str) -> str:
        if path.split("?", 1)[0] in ("", "/"):
            path = "/static/index.html"
        return super().translate_path(path)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test output is for the tests."""


@contextlib.contextmanager
def static_server() -> Iterator[str]:
    """The dashboard's files alone on a loopback port (no API behind them); yields the base URL."""
    handler = functools.partial(_StaticHandler, directory=str(STATIC_DIR.parent))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def screenshot(page: Any, name: str, *, full_page: bool = True) -> Path:
    """Save a PNG of `page` under SCREENSHOTS_DIR and say where."""
    SCREENSHOTS_DIR.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS_DIR / f"{name}.png"
    page.evaluate("window.scrollTo(0, 0)")  # else the sticky top bar lands mid-page in a full-page shot
    page.screenshot(path=str(path), full_page=full_page)
    print(f"screenshot: {path}")
    return path
