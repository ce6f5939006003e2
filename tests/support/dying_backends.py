"""Test backends whose compiled code kills the process when it runs (not while it compiles), as a
generated kernel that segfaults or a heap overrun that glibc aborts on does: the graph compiles,
and its first run with the chosen op dies by SIGABRT (`os.abort`), SIGSEGV (a null pointer read
through ctypes) or `os._exit(3)`, or never returns (`hang_at_run_on`). Graphs without the op run
eagerly.

Sandbox children import them by path (`tests.support.dying_backends:segfault_at_run_on_relu`)
when `MINIFY_ALLOWED_BACKENDS` allows `tests.support`.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable
from typing import Any, Literal

from torch import fx

from tests.support.backends import Backend, has_op

Death = Literal["abort", "segfault", "exit"]
EXIT_CODE = 3


def die(how: Death) -> None:
    if how == "abort":
        os.abort()
    elif how == "segfault":
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    else:
        os._exit(EXIT_CODE)


def die_at_run_on(op: str, how: Death) -> Backend:
    """Compile anything; a graph with `op` kills the process `how` when it runs."""

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        dies = has_op(gm, op)

        def run(*args: Any) -> Any:
            if dies:
                die(how)
            return gm(*args)

        return run

    return backend


def hang_at_run_on(op: str) -> Backend:
    """Compile anything; a graph with `op` never returns from its run (a kernel stuck in a loop)."""

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        hangs = has_op(gm, op)

        def run(*args: Any) -> Any:
            while hangs:
                time.sleep(3600)
            return gm(*args)

        return run

    return backend


abort_at_run_on_relu = die_at_run_on("relu", "abort")
hang_at_run_on_relu = hang_at_run_on("relu")
segfault_at_run_on_relu = die_at_run_on("relu", "segfault")
exit_at_run_on_relu = die_at_run_on("relu", "exit")


def abort_where_eager_raises(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Compile anything; a run that raises (eagerly, as the graph itself does) aborts the process
    instead: a bounds check that a generated kernel turns into a death (pytorch#126691)."""

    def run(*args: Any) -> Any:
        try:
            return gm(*args)
        except Exception:
            die("abort")

    return run
