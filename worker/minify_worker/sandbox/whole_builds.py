"""Inductor's C++ builds written whole or not at all, in the processes the sandbox may kill.

Inductor builds a kernel straight into its place in the compile cache (`g++ ... -o <cache>/<key>.so`)
and trusts any file found there: the next process that wants the kernel sees it exists and loads it.
A candidate child killed while the linker writes (its timeout, a cancelled candidate, a hang) leaves
a truncated library behind, and every later load of that kernel fails with `ImportError: ... file
too short`, in this job's later candidates, in later jobs on the machine (the cache is shared:
`compile_cache_dir`), and in a repro.py run beside them. A candidate would then be judged by a
failure the program does not have. The same holds for the precompiled header, and for the
vector-ISA probe's libraries: a truncated one fails its load check, and every later process on the
machine would compile for a narrower ISA than the CPU has, without a word.

`install()` wraps `CppBuilder.build` (every C++ build inductor makes, the same in torch 2.11 to
2.15) so that the compiler writes to a file of its own beside the target, renamed onto it once the
compiler has finished: a rename is atomic, so the target is either absent or whole. What a killed
build wrote (`partial-<pid>-<name>`) is never loaded; the next build of a kernel or header
(`codecache._worker_compile_cpp`, under inductor's lock for that target) removes it. Where a
builder's command does not end with its target as expected (fbcode's relative paths), it builds as
inductor would. The same wrapper remembers a job's failed builds (`failed_builds`).
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Callable, Sequence
from typing import Any

from .failed_builds import build_remembering_failures

_INSTALLED = "_minify_whole_builds"


def install() -> None:
    """Make this process's (and its forks') inductor C++ builds atomic, and a failed build of this
    job fail again without the compiler (`failed_builds`); idempotent."""
    import torch._inductor.codecache as codecache
    import torch._inductor.cpp_builder as cpp_builder

    if getattr(cpp_builder.CppBuilder.build, _INSTALLED, False):
        return
    build_in_place = cpp_builder.CppBuilder.build

    def build(self: Any) -> None:
        build_remembering_failures(self, lambda builder: build_whole(builder, build_in_place))

    def _worker_compile_cpp(lock_path: str, cpp_builders: Sequence[Any]) -> None:
        from torch.utils._filelock import FileLock

        with FileLock(lock_path, timeout=codecache.LOCK_TIMEOUT):
            for builder in cpp_builders:
                target = builder.get_target_file_path()
                if not os.path.exists(target):
                    _remove_partials(target)  # under the target's lock: no other build of it runs
                    builder.build()

    setattr(build, _INSTALLED, True)
    cpp_builder.CppBuilder.build = build
    codecache._worker_compile_cpp = _worker_compile_cpp


def build_whole(builder: Any, build_in_place: Callable[[Any], None]) -> None:
    """`build_in_place(builder)` with its output written under a name of its own and renamed onto
    the target."""
    target = builder.get_target_file_path()
    output = getattr(builder, "_output", None)
    if not isinstance(output, str) or not output.endswith(target):
        build_in_place(builder)
        return
    folder, name = os.path.split(target)
    partial = os.path.join(folder, f"partial-{os.getpid()}-{name}")
    builder._output = output[: -len(target)] + partial
    try:
        build_in_place(builder)
        os.replace(partial, target)
    finally:
        builder._output = output
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)


def _remove_partials(target: str) -> None:
    folder, name = os.path.split(target)
    for left in glob.glob(os.path.join(glob.escape(folder), f"partial-*-{glob.escape(name)}")):
        with contextlib.suppress(FileNotFoundError):
            os.remove(left)
