"""Capture every failing torch.compile graph and aoti_compile_and_package call of a pytest run.

Switched on by `MINIFY_CAPTURE_DIR=DIR` or `MINIFY_CAPTURE=1` (through the `_minify_pytestplugin`
entry point) or `pytest -p minify_client.pytest_plugin`. Each failing compiler call of a test is
captured into the capture directory (`CaptureSession.from_environment`), named after the test id,
once per bug with every test that hit it in `captures.json`. A test's outcome and error stay what
they were; a note on the error says where its capture went. torch's compiler entry points are
patched once torch has been imported by the suite; before that, nothing of torch is touched.
"""

from __future__ import annotations

import sys
from collections.abc import Generator
from typing import Any

import pytest

from minify_client.capture.session import CaptureSession

PLUGIN_NAME = "minify-capture"


def pytest_configure(config: pytest.Config) -> None:
    register(config)  # loaded with -p: capture was asked for explicitly


def register(config: pytest.Config) -> None:
    """Register the capture hooks once, however many ways the plugin was switched on."""
    if not config.pluginmanager.has_plugin(PLUGIN_NAME):
        config.pluginmanager.register(CapturePlugin(), PLUGIN_NAME)


class CapturePlugin:
    def __init__(self) -> None:
        self.session = CaptureSession.from_environment()
        self._started = False

    def _start_once_torch_is_imported(self) -> bool:
        if not self._started and "torch" in sys.modules:
            self.session.start()
            self._started = True
        return self._started

    def _around(self, item: pytest.Item) -> Generator[None, Any, Any]:
        if not self._start_once_torch_is_imported():
            return (yield)
        self.session.begin(item.nodeid)
        try:
            result = yield
        except BaseException as error:
            self.session.finish(error)  # notes where the capture went; the error itself is re-raised
            raise
        self.session.finish()
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, Any, Any]:
        return (yield from self._around(item))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        return (yield from self._around(item))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None, Any, Any]:
        return (yield from self._around(item))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        self.session.load_manifest()  # under pytest-xdist this process ran no test: its workers captured
        if self.session.entries:
            terminalreporter.write_sep("-", "minify captures")
            for entry in self.session.entries.values():
                terminalreporter.write_line(f"{entry.name}: {entry.signature} ({len(entry.tests)} tests)")
            terminalreporter.write_line(f"manifest: {self.session.directory / 'captures.json'}; "
                                        f"submit with: minify-client submit-captures {self.session.directory}")

    def pytest_unconfigure(self) -> None:
        self.session.stop()
