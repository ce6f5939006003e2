"""Running several jobs' repro.py files as `python repro.py` would, for one torch import (issue 41).

`run_repro` (tests/support/repro.py) starts a fresh interpreter per repro.py, and each imports
torch again (~3 CPU-s on CI's machine, before the repro's own work). A module that checks several
repros starts one `ReproForks` instead: a child interpreter, started as `run_repro` starts one (this
process's environment, the repo root on PYTHONPATH), that runs `PRELUDE`, the first two lines of
every repro.py (`import torch`, `import torch._inductor.config`, which loads dynamo: ~2 of a repro's
~3.5 CPU-s besides the interpreter), and nothing else (no op runs, so no thread pool exists to be
lost in a fork), then forks once per repro. A repro whose text does not begin with those lines runs
in a fresh interpreter instead (`run_repro`), so a repro that left one out is judged as its reader
would run it. Each fork is what `python repro.py` would be after those lines: it changes to
the repro's folder, puts the folder first on sys.path (as Python does for a script), runs the file
as `__main__` with `sys.argv == ["repro.py"]`, writes its stdout and stderr to files of its own,
and exits with the script's status (1 for an uncaught exception, after `sys.excepthook`, which
repro.py replaces to say what failed, as Python does). Nothing of the test process's state reaches
it: not its imports, not dynamo's caches, not a torch config a test set. Each fork starts from the
same untouched interpreter, so one repro leaves nothing to the next.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import TracebackType

from tests.support.repro import run_repro

# What the server imports before it forks, as every fx repro.py begins (programs/fx/repro.py).
PRELUDE = ("torch", "torch._inductor.config")


def begins_with_prelude(text: str) -> bool:
    """Whether the script's first statements (its docstring aside) are `import torch` and `import
    torch._inductor.config`, in that order: then a fork that ran them already is where the script
    would be after them."""
    body = ast.parse(text).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    leading = [statement.names[0].name if isinstance(statement, ast.Import) and len(statement.names) == 1
               and statement.names[0].asname is None else None for statement in body[:len(PRELUDE)]]
    return tuple(leading) == PRELUDE


# The child: PRELUDE, then for each request line (a repro's path and two output files) fork,
# run the script in the fork and answer its exit status.
_SERVER = r"""
import json, os, runpy, sys

import torch  # noqa: F401  (every repro.py's first imports, PRELUDE: paid once here)
import torch._inductor.config  # noqa: F401

def run(repro, stdout, stderr):
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
    os._exit(code)

for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        run(request["repro"], request["stdout"], request["stderr"])
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    sys.__stdout__.write(json.dumps({"returncode": code}) + "\n")
    sys.__stdout__.flush()
"""


class ReproForks:
    """One torch-importing interpreter that runs each repro.py given to `run` in a fork of its own;
    a context manager (the interpreter ends with it)."""

    def __init__(self) -> None:
        self._outputs = Path(tempfile.mkdtemp(prefix="repro-forks-"))
        self._count = 0
        self._server = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, env=dict(os.environ), text=True)

    def run(self, repro: Path) -> subprocess.CompletedProcess[str]:
        """`repro` run as `python repro.py` from its folder; its status and its output as text."""
        if not begins_with_prelude(repro.read_text()):
            return run_repro(repro)
        assert self._server.stdin is not None and self._server.stdout is not None
        self._count += 1
        stdout, stderr = self._outputs / f"{self._count}.out", self._outputs / f"{self._count}.err"
        request = {"repro": str(repro.resolve()), "stdout": str(stdout), "stderr": str(stderr)}
        self._server.stdin.write(json.dumps(request) + "\n")
        self._server.stdin.flush()
        answer = self._server.stdout.readline()
        if not answer:
            raise RuntimeError(f"the repro server ended (status {self._server.wait()})")
        returncode = json.loads(answer)["returncode"]
        return subprocess.CompletedProcess([sys.executable, repro.name], returncode,
                                           stdout.read_text(errors="replace"), stderr.read_text(errors="replace"))

    def close(self) -> None:
        if self._server.stdin is not None:
            self._server.stdin.close()
        self._server.wait(timeout=60)

    def __enter__(self) -> ReproForks:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()
