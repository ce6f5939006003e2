"""A capture run: every failing compile of a test suite or script, saved once per bug, with a
manifest (`captures.json`) of what was captured and which tests hit it.

The pytest plugin and the script runner drive one `CaptureSession`: `begin(test_id)` before a test
(or the script), `finish(error)` after it. Failing compiler calls reported meanwhile are exported,
saved as `<dir>/<name>/<name>.pt2` (or `<name>.json`: `program_file`) + `spec.json` + `inputs.pt`
(the name from the test id) and submitted where the destination says so; the same failing graph
(`failed_graph.capture_key`) hit again by another test only adds that test to its manifest entry.
A capture that fails is logged and noted on the test's error; it never changes the test's outcome.

Several processes may capture into one directory at once (pytest-xdist's workers each run a
session of their own): a session extends the manifest under a lock on the directory, after reading
what the others wrote, so a bug hit in two workers is captured once and no entry is lost.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; one capturing process per directory there
    fcntl = None  # type: ignore[assignment]

from . import crash
from .destinations import DEFAULT_CAPTURE_DIR, add_note, save_and_submit
from .failed_graph import capture_key, exported, signature_of
from .torch_hooks import FailedCompile, Level, add_listener, remove_listener
from .whole_model import on_cuda

logger = logging.getLogger(__name__)

MANIFEST = "captures.json"
LOCK = ".captures.lock"


@dataclass
class Entry:
    """One captured bug in the manifest; paths relative to the capture directory."""

    name: str
    key: str
    level: str
    kind: str
    backend: str
    signature: str
    chain: list[str]
    program: str
    spec: str
    inputs: str
    tests: list[str] = field(default_factory=list)
    job: str | None = None
    dashboard: str | None = None
    static_reason: str | None = None  # compiled with symbolic sizes, captured static: why


@dataclass(frozen=True)
class Supervised:
    """How a supervised run ended (`CaptureSession.supervise`): its child's returncode (-N for a
    signal) and the captures adopted from what it left pending."""

    returncode: int
    adopted: list[Entry]

    @property
    def hung(self) -> bool:
        return any(entry.kind == "hang" for entry in self.adopted)

    def exit_status(self) -> int:
        """The supervisor's own exit status: the child's (`crash.end_like`), 124 where it was stopped as a hang."""
        return crash.end_like(self.returncode, hung=self.hung)


class CaptureSession:
    """Captures into `directory`; also submits each new capture to `submit_to` when given."""

    def __init__(self, directory: str | os.PathLike[str] | None = None, *, submit_to: str | None = None,
                 token: str | None = None, level: Level = "dynamo", accuracy: bool = False,
                 crash: bool = False, hang: float | None = None) -> None:
        self.directory = Path(directory) if directory is not None else DEFAULT_CAPTURE_DIR
        self.submit_to = submit_to
        self.token = token
        self.level: Level = level
        self.accuracy = accuracy
        self.crash = crash  # guard each compiled graph's first run (capture/crash.py)
        self.hang = hang  # seconds: also each compile; the supervisor stops what lasts longer (crash.py)
        self.entries: dict[str, Entry] = {}
        self.compiled = False  # a graph compiled since this session started
        self._test = "run"
        self._pending: list[FailedCompile] = []
        self._guard_failed = False
        self.load_manifest()

    @classmethod
    def from_environment(cls) -> CaptureSession:
        """MINIFY_CAPTURE_DIR (default ./minify-captures); submitted to MINIFY_SERVER when no
        directory is named (as `capture_failures` does); MINIFY_CAPTURE_LEVEL=aot;
        MINIFY_CAPTURE_ACCURACY=1; MINIFY_CAPTURE_CRASH=1; MINIFY_CAPTURE_HANG=SECONDS (a value that is
        no number of seconds raises `crash.BadHangLimit`)."""
        directory = os.environ.get("MINIFY_CAPTURE_DIR")
        submit_to = os.environ.get("MINIFY_SERVER") if not directory else None
        level = "aot" if os.environ.get("MINIFY_CAPTURE_LEVEL") == "aot" else "dynamo"
        return cls(directory, submit_to=submit_to, token=os.environ.get("MINIFY_TOKEN"), level=level,
                   accuracy=os.environ.get("MINIFY_CAPTURE_ACCURACY") == "1", crash=crash.requested(),
                   hang=crash.hang_limit())

    @property
    def guards_first_runs(self) -> bool:
        """Each compiled graph's first run is written as a pending capture first (crash or hang)."""
        return self.crash or self.hang is not None

    def start(self) -> None:
        """Listen to torch's compiler calls (imports torch's dynamo and inductor); with `crash` or
        `hang`, first adopt what crashed or hung processes left pending in the directory."""
        if self.guards_first_runs:
            self.adopt()
        if self.hang is not None and crash.supervised():
            crash.dump_stack_on_request()
        add_listener(self)

    def stop(self) -> None:
        remove_listener(self)
        if self.guards_first_runs:
            crash.drop_own(self.directory)

    def on_compiled(self) -> None:
        self.compiled = True

    def before_first_run(self, describe: Callable[[], FailedCompile]) -> Path | None:
        """Write the graph about to run for the first time as a pending capture (crash.py)."""
        return self._write_pending(describe, "first run")

    def after_first_run(self, folder: Path | None) -> None:
        crash.drop(folder)

    def before_compile(self, describe: Callable[[], FailedCompile]) -> Path | None:
        """Write the graph about to be compiled as a pending capture (`hang`: crash.py)."""
        return self._write_pending(describe, "compile")

    def after_compile(self, folder: Path | None) -> None:
        crash.drop(folder)

    def _write_pending(self, describe: Callable[[], FailedCompile], phase: str) -> Path | None:
        try:
            failed = describe()
            crash.check_savable(failed.inputs or [])
            threads = crash.compile_threads(failed.backend, on_cuda(failed.inputs or []))
            # A compile for training hangs in its backward as well as its forward: the job compiles so.
            training = {"training": True} if phase == "compile" and failed.for_training else {}
            program = exported(failed, {"failure": {"kind": "crash", "signature": None, **training},
                                        **({"config": threads} if threads else {})})
            return crash.write_pending(self.directory, program, test=self._test, key=capture_key(failed),
                                       level=failed.level, backend=failed.backend, phase=phase)
        except Exception as error:  # the run goes on unguarded; said once, not per graph
            if not self._guard_failed:
                said = str(error) if isinstance(error, crash.UnsavableInputs) else f"{type(error).__name__}: {error}"
                watched = "crashes and hangs" if self.hang is not None and self.crash else (
                    "hangs" if self.hang is not None else "crashes")
                logger.warning("minify: cannot guard a compiled graph's %s for %s (%s); one there would leave "
                               "no capture", phase, watched, said)
                self._guard_failed = True
            return None

    def adopt(self, *, pid: int | None = None, returncode: int | None = None) -> list[Entry]:
        """Turn the pending captures of processes that died into captures: those of `pid` (the
        supervised child, which ended with `returncode`) signed with how it died, those of any
        other dead process with no signature. A child that ended with 0 crashed in no first run:
        its pending folders are dropped. Returns the entries adopted."""
        adopted: list[Entry] = []
        if not (self.directory / crash.PENDING).is_dir():
            return adopted  # nothing was ever pending here: no directory made for nothing
        with _directory_lock(self.directory):
            self.load_manifest()
            for entry in crash.pending(self.directory):
                if entry.pid == pid and returncode == 0:
                    crash.drop(entry.folder)
                    continue
                if entry.pid != pid and not crash.orphaned(entry):
                    continue
                signature = crash.death_signature(returncode) if entry.pid == pid and returncode is not None else None
                adopted.append(self._adopt_one(entry, signature))
            if adopted:
                self._write_manifest()
        return adopted

    def supervise(self, command: Sequence[str], *, cwd: str | os.PathLike[str] | None = None) -> Supervised:
        """Run `command` as a supervised child (`crash.supervise`, its hangs watched where the session
        has a bound), adopting what earlier runs left pending before it and what it left after."""
        self.adopt()
        pid, returncode = crash.supervise(command, cwd=cwd, directory=self.directory, hang_s=self.hang)
        return Supervised(returncode, self.adopt(pid=pid, returncode=returncode))

    def _adopt_one(self, pending: crash.Pending, signature: str | None) -> Entry:
        stopped = pending.stopped()
        if stopped is not None:  # the supervisor stopped it as a hang: how it died is its doing
            signature = None
            said = f"hang: its {pending.phase} lasted past {float(stopped.get('bound_s') or 0):g} s"
        else:
            said = signature or "crash (how the process died is unknown)"
        key = crash.adopted_key(pending.key, "hang" if stopped is not None else signature)
        entry = self.entries.get(key)
        if entry is None:
            name = self._free_name(safe_name(pending.test))
            crash.move_into(pending, self.directory / name, name, signature, hung=stopped is not None)
            entry = Entry(name=name, key=key, level=pending.level, kind="hang" if stopped is not None else "crash",
                          backend=pending.backend, signature=said,
                          chain=[signature] if signature else [],
                          program=f"{name}/{name}{Path(pending.program).suffix}", spec=f"{name}/spec.json",
                          inputs=f"{name}/inputs.pt",
                          static_reason=pending.static_reason)
            self.entries[key] = entry
        else:
            crash.drop(pending.folder)
        if pending.test not in entry.tests:
            entry.tests.append(pending.test)
        return entry

    def on_failure(self, failed: FailedCompile) -> None:
        self._pending.append(failed)

    def begin(self, test_id: str) -> None:
        self._test = test_id
        self._pending = []

    def finish(self, error: BaseException | None = None) -> list[Entry]:
        """Capture what failed since `begin`; note on `error` where it went."""
        pending, self._pending = self._pending, []
        hit: list[Entry] = []
        if not pending:
            return hit
        with _directory_lock(self.directory):
            self.load_manifest()  # what other processes captured meanwhile
            for failed in pending:
                try:
                    entry = self._capture(failed)
                except Exception as capture_error:
                    logger.warning("minify: could not capture the failing graph of %s: %s", self._test, capture_error)
                    if error is not None:
                        add_note(error, f"minify: could not capture the failing graph: {capture_error}")
                    continue
                if entry not in hit:
                    hit.append(entry)
            if hit:
                self._write_manifest()
        if error is not None:
            for entry in hit:
                add_note(error, self.describe(entry))
        return hit

    def describe(self, entry: Entry) -> str:
        where = self.directory / Path(entry.program).parent
        first = f" (first hit by {entry.tests[0]})" if entry.tests and entry.tests[0] != self._test else ""
        job = f"; submitted as minify job {entry.job} ({entry.dashboard})" if entry.job else ""
        if entry.kind == "crash":
            what = f"the {entry.level} graph whose first run killed the process ({entry.signature})"
        elif entry.kind == "hang":
            what = f"the {entry.level} graph that hung ({entry.signature})"
        else:
            what = f"the failing {entry.level} graph ({entry.signature})"
        return (f"minify: captured {what} in {where}{first}{job}; "
                f"submit with: minify-client submit-captures {self.directory}")

    def _capture(self, failed: FailedCompile) -> Entry:
        key = capture_key(failed)
        entry = self.entries.get(key)
        if entry is None:
            entry = self._save(failed, key)
            self.entries[key] = entry
        if self._test not in entry.tests:
            entry.tests.append(self._test)
        return entry

    def _save(self, failed: FailedCompile, key: str) -> Entry:
        name = self._free_name(safe_name(self._test))
        program = exported(failed)
        captured = save_and_submit(program.program, program.args, program.kwargs, program.spec, name=name,
                                   destination=self.directory / name, submit_to=self.submit_to, token=self.token,
                                   chain=program.chain)
        return Entry(name=name, key=key, level=failed.level if not failed.is_backward else "aot (backward)",
                     kind=failed.kind, backend=failed.backend, signature=signature_of(failed),
                     chain=list(program.chain), program=f"{name}/{captured.program_name}", spec=f"{name}/spec.json",
                     inputs=f"{name}/inputs.pt", job=captured.job.id if captured.job else None,
                     dashboard=captured.dashboard, static_reason=program.static_reason)

    def _free_name(self, name: str) -> str:
        taken = {entry.name for entry in self.entries.values()}
        candidate, number = name, 1
        while candidate in taken:
            number += 1
            candidate = f"{name}-{number}"
        return candidate

    def load_manifest(self) -> None:
        """Read the directory's manifest into this session: a directory captured into before (an
        earlier run, another process) keeps its entries, and the manifest's version of an entry (a
        superset: every writer read it first) replaces this session's."""
        path = self.directory / MANIFEST
        try:
            data = json.loads(path.read_text())
            for item in data.get("captures", []):
                entry = Entry(**item)
                self.entries[entry.key] = entry
        except (OSError, ValueError, TypeError):
            return

    def _write_manifest(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / MANIFEST
        temporary = path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps({"captures": [asdict(entry) for entry in self.entries.values()]},
                                        indent=2) + "\n")
        temporary.replace(path)


@contextmanager
def _directory_lock(directory: Path) -> Iterator[None]:
    """Held while a session reads, extends and rewrites `directory`'s manifest. A directory that
    cannot be written is not an error here: each capture then fails on its own, noted on its test."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        handle = open(directory / LOCK, "a")  # closed below; closing it releases the lock
    except OSError as error:
        logger.warning("minify: cannot lock %s: %s", directory / LOCK, error)
        yield
        return
    with handle:
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def safe_name(test_id: str) -> str:
    """A test id as a file name: `tests/test_x.py::test_a[1]` -> `test_x.py-test_a-1`."""
    last = test_id.replace("\\", "/").rsplit("/", 1)[-1]
    name = re.sub(r"[^\w.-]+", "-", last).strip("-.")
    return name[:120] or "capture"


def read_manifest(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The entries of `directory`'s captures.json (empty when there is none)."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return []
    return list(json.loads(path.read_text()).get("captures", []))


def record_job(directory: str | os.PathLike[str], name: str, job: str, dashboard: str | None) -> None:
    """Write the job a capture was submitted as (and its dashboard page) into its manifest entry,
    under the directory's lock, as a session extends the manifest."""
    path = Path(directory) / MANIFEST
    with _directory_lock(Path(directory)):
        data = json.loads(path.read_text())
        for item in data.get("captures", []):
            if item.get("name") == name:
                item["job"], item["dashboard"] = job, dashboard
        temporary = path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(data, indent=2) + "\n")
        temporary.replace(path)
