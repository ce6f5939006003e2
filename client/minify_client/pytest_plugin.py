"""Capture every failing torch.compile graph and aoti_compile_and_package call of a pytest run.

Switched on by `MINIFY_CAPTURE_DIR=DIR` or `MINIFY_CAPTURE=1` (through the `_minify_pytestplugin`
entry point) or `pytest -p minify_client.pytest_plugin`. Each failing compiler call of a test is
captured into the capture directory (`CaptureSession.from_environment`), named after the test id,
once per bug with every test that hit it in `captures.json`. A test's outcome and error stay what
they were; a note on the error says where its capture went. torch's compiler entry points are
patched once torch has been imported by the suite; before that, nothing of torch is touched.

With `MINIFY_CAPTURE_CRASH=1` the run is supervised (`pytest_cmdline_main`): pytest runs again as
a child of this process, and a compiled graph whose first run kills it still leaves its capture
(capture/crash.py); this process then ends as the child did. `MINIFY_CAPTURE_HANG=SECONDS` too, and
a compile or first run that lasts past SECONDS is stopped and captured as a hang (exit 124). With
`MINIFY_CAPTURE_DIAGNOSE=1`, a
test that failed after compiling something and left no capture is rerun at the end of the session
to say which layer of torch.compile is to blame (capture/diagnose.py), in the summary.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from minify_client.capture import crash, diagnose
from minify_client.capture.session import CaptureSession, safe_name
from minify_contract import signatures

PLUGIN_NAME = "minify-capture"


def pytest_configure(config: pytest.Config) -> None:
    register(config)  # loaded with -p: capture was asked for explicitly


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    return supervise(config)


def supervise(config: pytest.Config) -> int | None:
    """MINIFY_CAPTURE_CRASH=1: run this pytest command again as a supervised child and end as it
    did, after adopting what it left pending if it died (None: run here, as usual). A pytest run
    in-process (`pytest.main()`) is not re-run: its pending captures wait for the next session."""
    try:
        wanted = crash.supervision_requested()
    except crash.BadHangLimit as error:
        raise pytest.UsageError(str(error)) from None
    if not wanted or crash.supervised():
        return None
    command = _pytest_command(config)
    if command is None:
        return None
    session = CaptureSession.from_environment()
    run = session.supervise(command, cwd=config.invocation_params.dir)
    for entry in run.adopted:
        session.begin(entry.tests[0] if entry.tests else "run")
        ended = "the test process hung" if entry.kind == "hang" else f"the test process died: {entry.signature}"
        print(f"{session.describe(entry)} ({ended})", file=sys.stderr)
    return run.exit_status()


def _pytest_command(config: pytest.Config) -> list[str] | None:
    """The command line that started this pytest, to run again: `python -m pytest` or the
    `pytest` script."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    by_module = spec is not None and spec.name in ("pytest", "pytest.__main__")
    if not by_module and Path(sys.argv[0]).name not in ("pytest", "py.test"):
        return None
    return [sys.executable, "-m", "pytest", *config.invocation_params.args]


def register(config: pytest.Config) -> None:
    """Register the capture hooks once, however many ways the plugin was switched on."""
    if not config.pluginmanager.has_plugin(PLUGIN_NAME):
        config.pluginmanager.register(CapturePlugin(), PLUGIN_NAME)


class CapturePlugin:
    def __init__(self) -> None:
        self.session = CaptureSession.from_environment()
        self._started = False
        self._undiagnosed: list[tuple[str, str, float]] = []  # (test id, signature, seconds) to rerun
        self._refused: list[tuple[str, str]] = []  # (test id, note): dynamo raised before anything compiled

    def _start_once_torch_is_imported(self) -> bool:
        if not self._started and "torch" in sys.modules:
            self.session.start()
            self._started = True
        return self._started

    def _around(self, item: pytest.Item, phase: str = "") -> Generator[None, Any, Any]:
        if not self._start_once_torch_is_imported():
            return (yield)
        self.session.begin(item.nodeid)
        started = time.monotonic()
        try:
            result = yield
        except BaseException as error:
            captured = self.session.finish(error)  # notes where the capture went; the error itself is re-raised
            refused = (diagnose.refused_before_compile(error)
                       if phase == "call" and not captured and not self.session.compiled else None)
            if refused:
                self._refused.append((item.nodeid, refused))
            if (phase == "call" and diagnose.requested() and not captured and self.session.compiled
                    and _diagnosable(item, error)):
                self._undiagnosed.append((item.nodeid, signatures.signature_line(error), time.monotonic() - started))
            raise
        self.session.finish()
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, Any, Any]:
        return (yield from self._around(item))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        return (yield from self._around(item, "call"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None, Any, Any]:
        return (yield from self._around(item))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """The failing tests no capture holds, rerun to say which layer is to blame (diagnose.py);
        under pytest-xdist each worker reruns its own. Their reruns fork from servers they share
        (`diagnose.Servers`): one torch import for the session's failures, not one per failure."""
        undiagnosed, self._undiagnosed = self._undiagnosed, []
        with diagnose.Servers() as servers:  # tests whose files import the same torch modules share one
            for test, signature, seconds in undiagnosed:
                command = diagnose.pytest_command(test, session.config.rootpath, session.config.inipath)
                diagnose.diagnose(test, signature, command, directory=self.session.directory, name=safe_name(test),
                                  timeout_s=diagnose.rerun_timeout_s(seconds), servers=servers)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.session.guards_first_runs:
            self.session.adopt()  # an xdist worker that died or hung in a compiled graph: its pending captures
        if self._refused:
            terminalreporter.write_sep("-", "minify: failures dynamo raised before anything compiled")
            for test, note in self._refused:
                terminalreporter.write_line(f"{test}: {note}")
        found = diagnose.read_diagnoses(self.session.directory) if diagnose.requested() else []
        if found:
            terminalreporter.write_sep("-", "minify: failures no captured graph holds")
            for entry in found:
                terminalreporter.write_line(f"{entry['test']}: {entry['message']}")
            terminalreporter.write_line(f"reruns and their logs: {self.session.directory / diagnose.MANIFEST}")
        self.session.load_manifest()  # under pytest-xdist this process ran no test: its workers captured
        if self.session.entries:
            terminalreporter.write_sep("-", "minify captures")
            for entry in self.session.entries.values():
                terminalreporter.write_line(f"{entry.name}: {entry.signature} ({len(entry.tests)} tests)")
            terminalreporter.write_line(f"manifest: {self.session.directory / 'captures.json'}; "
                                        f"submit with: minify-client submit-captures {self.session.directory}")

    def pytest_unconfigure(self) -> None:
        self.session.stop()


def _diagnosable(item: pytest.Item, error: BaseException) -> bool:
    """A test failure worth rerunning: an error or a failed assertion, not a skip or an xfail."""
    if item.get_closest_marker("xfail") is not None:
        return False
    return isinstance(error, (Exception, pytest.fail.Exception))
