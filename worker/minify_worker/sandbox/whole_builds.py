"""Inductor's C++ builds written whole or not at all, in the processes the sandbox may kill.

Inductor builds a kernel straight into its place in the compile cache (`g++ ... -o <cache>/<key>.so`)
and trusts any file found there: the next process that wants the kernel sees it exists and loads it.
A candidate child killed while the linker writes (its timeout, a cancelled candidate, a hang) leaves
a truncated library behind, and every later load of that kernel fails with `ImportError: ... file
too short`, in this job's later candidates, in later jobs on the machine (the cache is shared:
`compile_cache_dir`), and in a repro.py run beside them. A candidate would then be judged by a
failure the program does not have.

`install()` replaces inductor's build step (`codecache._worker_compile_cpp`, the same in torch
2.11 to 2.15) with one that links to a file of its own beside the target and renames it into place
once the compiler has finished: a rename is atomic, so the target is either absent or whole. The
lock, the check for an existing target and the order of builds are inductor's own. What a killed
build wrote (`partial-<pid>-<name>`) is never loaded, and goes at the next build of that target.
Where a builder's command does not end with its target as expected, it builds as inductor would.
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Sequence
from typing import Any

_INSTALLED = "_minify_whole_builds"


def install() -> None:
    """Make this process's (and its forks') inductor C++ builds atomic; idempotent."""
    import torch._inductor.codecache as codecache

    if getattr(codecache._worker_compile_cpp, _INSTALLED, False):
        return

    def _worker_compile_cpp(lock_path: str, cpp_builders: Sequence[Any]) -> None:
        from torch.utils._filelock import FileLock

        with FileLock(lock_path, timeout=codecache.LOCK_TIMEOUT):
            for builder in cpp_builders:
                if not os.path.exists(builder.get_target_file_path()):
                    build_whole(builder)

    setattr(_worker_compile_cpp, _INSTALLED, True)
    codecache._worker_compile_cpp = _worker_compile_cpp


def build_whole(builder: Any) -> None:
    """`builder.build()`, its output written under a name of its own and renamed onto the target."""
    target = builder.get_target_file_path()
    output = getattr(builder, "_output", None)
    if not isinstance(output, str) or not output.endswith(target):
        builder.build()
        return
    folder, name = os.path.split(target)
    # Under inductor's lock for this target no other build of it runs: a partial file of it is a
    # killed build's, and goes.
    for left in glob.glob(os.path.join(glob.escape(folder), f"partial-*-{glob.escape(name)}")):
        with contextlib.suppress(FileNotFoundError):
            os.remove(left)
    partial = os.path.join(folder, f"partial-{os.getpid()}-{name}")
    builder._output = output[: -len(target)] + partial
    try:
        builder.build()
        os.replace(partial, target)
    finally:
        builder._output = output
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)
