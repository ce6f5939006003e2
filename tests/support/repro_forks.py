"""Running several jobs' repro.py files as `python repro.py` would, for one torch import (issue 41).

A fresh interpreter per repro.py imports torch again (~3 CPU-s on CI's machine, before the repro's
own work). A `ReproForks` is a child interpreter, started as a fresh repro would be (this process's
environment, the repo root on PYTHONPATH), that runs `PRELUDE`, the first two imports of every
repro.py (`import torch`, `import torch._inductor.config`, which loads dynamo: ~2 of a repro's ~3.5
CPU-s besides the interpreter), then imports what the repro's torch.compile will (`COMPILER_MODULES`,
dynamo's backends and inductor's compiler: 0.7 s of each repro's run here), as the sandbox's fork
server does before its candidates and `minify-client reduce`'s servers before their runs, and
nothing else (no op runs, so no thread pool exists to be lost in a fork), then forks once per
repro; once a repro has run inductor's CPU vector-ISA probe (~2 CPU-s, a dozen `python -c`
checks, in every process that compiles for the CPU), the server runs it before the next fork, as
`minify-client reduce`'s servers do (`rerun.probe_vec_isa`), and the repros after it inherit it.
`run_repro` (tests/support/repro.py) runs every repro through
one such server per test process (`run_shared`), started with the environment the test modules were
collected in; a repro asked for with an environment that differs from it in a variable torch's
imports may read runs in a fresh interpreter, and so does a repro whose text does not begin with
those imports (after standard-library imports only), so a repro that left one out is judged as its
reader would run it. A module may start its own (the `repros` fixtures). Each fork is what `python
repro.py` would be after those lines: it changes to the repro's folder, puts the folder first on
sys.path (as Python does for a script), runs the file as `__main__` with `sys.argv == ["repro.py"]`,
writes its stdout and stderr to files of its own, and exits with the script's status (1 for an
uncaught exception, after `sys.excepthook`, which repro.py replaces to say what failed, as Python
does). Nothing of the test process's state reaches it: not its imports (the server's own, besides
the prelude's, are rerun.py's vector-ISA helpers, loaded by path, and what they import:
minify_contract.signatures, which no repro reads), not dynamo's caches, not a torch config a test
set. Each fork starts from the same untouched interpreter (but for the ISA probe's answer, which is
the machine's and not a repro's), so one repro leaves nothing to the next.
"""

from __future__ import annotations

import ast
import atexit
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from minify_client.capture import rerun
from tests.support.repro import run_fresh

# What the server imports before it forks, as every fx repro.py begins (programs/fx/repro.py).
PRELUDE = ("torch", "torch._inductor.config")
# And then what the repro's torch.compile imports, before the repro sets its config: what a sandbox
# child judges candidates with too (its fork server imports them first, sandbox/warmup.py).
COMPILER_MODULES = rerun.COMPILER_MODULES


def begins_with_prelude(text: str) -> bool:
    """Whether the script's first statements (its docstring aside) are `import torch` and `import
    torch._inductor.config`, in that order, after nothing but imports of the standard library
    (`import sys`, `from pathlib import Path`: modules torch's import loaded already): then a fork
    that ran them already is where the script would be after them."""
    body = ast.parse(text).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    seen: list[str] = []
    for statement in body:
        if isinstance(statement, ast.Import) and len(statement.names) == 1 and statement.names[0].asname is None \
                and statement.names[0].name == PRELUDE[len(seen)]:
            seen.append(statement.names[0].name)
            if len(seen) == len(PRELUDE):
                return True
        elif seen or not _imports_only_the_standard_library(statement):
            return False
    return False


def _imports_only_the_standard_library(statement: ast.stmt) -> bool:
    if isinstance(statement, ast.Import):
        return all(alias.name.split(".")[0] in sys.stdlib_module_names for alias in statement.names)
    if isinstance(statement, ast.ImportFrom):
        return statement.level == 0 and (statement.module or "").split(".")[0] in sys.stdlib_module_names \
            and statement.module != "__future__"
    return False


# The child: PRELUDE, then for each request line (a repro's path and two output files) fork,
# run the script in the fork and answer its exit status.
_SERVER = r"""
import json, os, runpy, sys

import torch  # noqa: F401  (every repro.py's first imports, PRELUDE: paid once here)
import torch._inductor.config  # noqa: F401
import importlib
for name in sys.argv[2:]:  # COMPILER_MODULES
    importlib.import_module(name)
# rerun.py by its path (not the client's package): its vector-ISA helpers, as the reduce servers use them
rerun = runpy.run_path(sys.argv[1])

def run(repro, stdout, stderr, tell):
    out = os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    err = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(err, 2)
    sys.stdin = open(os.devnull)
    folder, name = os.path.split(repro)
    os.chdir(folder)
    sys.path[0] = folder
    sys.argv = [name]
    code = 0
    try:
        runpy.run_path(name, run_name="__main__")
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        if not isinstance(done.code, int) and done.code is not None:
            print(done.code, file=sys.stderr)
    except BaseException:
        sys.excepthook(*sys.exc_info())  # as Python ends a script: the hook repro.py installs speaks
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    if rerun["vec_isa_probed"]():
        os.write(tell, b"1")
    os._exit(code)

probe_due = probed_here = False
for line in sys.stdin:
    request = json.loads(line)
    if probe_due and not probed_here:  # a repro compiled with inductor on the CPU: probe once, for all after
        rerun["probe_vec_isa"]()
        probed_here = True
    hear, tell = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(hear)
        if request.get("environment") is not None:  # the environment `python repro.py` would get
            os.environ.clear()
            os.environ.update(request["environment"])
        run(request["repro"], request["stdout"], request["stderr"], tell)
    os.close(tell)
    sys.__stdout__.write(json.dumps({"pid": pid}) + "\n")  # for a caller's timeout to stop it
    sys.__stdout__.flush()
    _, status = os.waitpid(pid, 0)
    probe_due = probe_due or rerun["told"](hear)
    os.close(hear)
    code = os.waitstatus_to_exitcode(status)
    sys.__stdout__.write(json.dumps({"returncode": code}) + "\n")
    sys.__stdout__.flush()
"""


class ReproForks:
    """One torch-importing interpreter that runs each repro.py given to `run` in a fork of its own;
    a context manager (the interpreter ends with it). It starts with `environment` (default: this
    process's now)."""

    def __init__(self, environment: dict[str, str] | None = None) -> None:
        self.environment = dict(os.environ if environment is None else environment)
        self._outputs = Path(tempfile.mkdtemp(prefix="repro-forks-", dir=self.environment.get("TMPDIR") or None))
        self._count = 0
        self._server = subprocess.Popen([sys.executable, "-c", _SERVER, rerun.__file__, *COMPILER_MODULES],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.environment, bufsize=0)
        self._pending = b""

    def run(self, repro: Path, timeout_s: float | None = None,
            environment: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """`repro` run as `python repro.py` from its folder (with `environment` in place of the
        server's, where given: it must agree with it on every variable torch's imports read); its
        status and its output as text. Past `timeout_s` the fork is killed and TimeoutExpired raised,
        as subprocess.run does."""
        if not begins_with_prelude(repro.read_text()):
            return run_fresh(repro, **({} if timeout_s is None else {"timeout_s": timeout_s}))
        assert self._server.stdin is not None
        self._count += 1
        stdout, stderr = self._outputs / f"{self._count}.out", self._outputs / f"{self._count}.err"
        request = {"repro": str(repro.resolve()), "stdout": str(stdout), "stderr": str(stderr),
                   "environment": environment}
        self._server.stdin.write((json.dumps(request) + "\n").encode())
        pid = self._answer(None)["pid"]
        try:
            returncode = self._answer(timeout_s)["returncode"]
        except subprocess.TimeoutExpired:
            os.kill(pid, signal.SIGKILL)
            self._answer(None)
            raise subprocess.TimeoutExpired([sys.executable, repro.name], timeout_s or 0) from None
        try:
            return subprocess.CompletedProcess([sys.executable, repro.name], returncode,
                                               stdout.read_text(errors="replace"),
                                               stderr.read_text(errors="replace"))
        finally:
            stdout.unlink(missing_ok=True)
            stderr.unlink(missing_ok=True)

    def _answer(self, timeout_s: float | None) -> dict:
        """The server's next line, waited for at most `timeout_s` (None: as long as it takes)."""
        assert self._server.stdout is not None
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while b"\n" not in self._pending:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self._server.stdout], [], [], left)[0]:
                    raise subprocess.TimeoutExpired("repro", timeout_s or 0)
            chunk = os.read(self._server.stdout.fileno(), 65536)
            if not chunk:
                raise RuntimeError(f"the repro server ended (status {self._server.wait()})")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        if self._server.stdin is not None:
            self._server.stdin.close()
        self._server.wait(timeout=60)
        shutil.rmtree(self._outputs, ignore_errors=True)

    def __enter__(self) -> ReproForks:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()


# -- run_repro's shared server: one per test process, started at its first repro (issue 41) --------

# What a variable may differ in between the server's start and a repro's environment: those torch's
# imports never read (the tests' own MINIFY_* settings, pytest's PYTEST_*). Any other difference (a
# TORCH* setting, PYTHONPATH, TMPDIR, ...) and the repro runs in a fresh interpreter.
_APPLIED_IN_THE_FORK = ("MINIFY_", "PYTEST_")
# Set by inductor in a process that loaded a compiled library, before that library reads it (a
# pointer of that process): a fresh interpreter inherits it unread.
_SET_BEFORE_READ = frozenset({"_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"})
# Set by jax in a process that starts its backend (the StableHLO tests do, in the test process),
# read by XLA and TensorFlow only: without them here, every repro after a StableHLO test in an xdist
# worker ran in a fresh interpreter (about 30 repros, 2-3 CPU-s of imports each, in a CI run).
# Applied in the fork like the others (its environment is the one asked for).
_READ_BY_XLA_ONLY = frozenset({"TPU_SKIP_MDS_QUERY", "TF_CPP_MIN_LOG_LEVEL"})
_NOT_READ_BY_TORCH = _SET_BEFORE_READ | _READ_BY_XLA_ONLY
_shared: ReproForks | None = None


def _unread_by_imports(environment: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in environment.items()
            if not name.startswith(_APPLIED_IN_THE_FORK) and name not in _NOT_READ_BY_TORCH}


def run_shared(repro: Path, environment: dict[str, str], base: dict[str, str],
               timeout_s: float) -> subprocess.CompletedProcess[str] | None:
    """`repro` run in a fork of this process's shared server (started with `base`, the test
    process's environment once the tests were collected, at the first call), given `environment`
    as its own; None where
    a fork is not what `python repro.py` would be (the script does not begin with PRELUDE, or the
    environment differs from `base` in a variable torch's imports may read)."""
    global _shared
    if not begins_with_prelude(repro.read_text()) or _unread_by_imports(environment) != _unread_by_imports(base):
        return None
    if _shared is None:
        _shared = ReproForks(base)
        atexit.register(_shared.close)
    return _shared.run(repro, timeout_s, environment)
