"""The warm-up's compile-cache builder: on a cold cache, a forked child builds the precompiled header
while the process runs inductor's ISA probe (`warmup._start_cache_builder`)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from minify_worker.sandbox import warmup


@pytest.mark.inductor
def test_a_cold_cache_is_built_beside_the_isa_probe_and_the_probes_own_pick_stands(tmp_path: Path) -> None:
    """The builder guesses the ISAs the CPU claims; here inductor is told no ISA is valid
    (`TORCHINDUCTOR_VEC_ISA_OK=0`), so its guess is wrong: the process still compiles with its own
    pick (a header of its own beside the builder's), its warm-up compile succeeds, and the builder
    is reaped."""
    script = (
        "import logging, os\n"
        "logging.basicConfig(level=logging.INFO, format='%(message)s')\n"
        "from minify_worker.sandbox import preload\n"
        "preload()\n"
        "import torch._inductor.cpu_vec_isa as isa\n"
        "print('picked', isa.pick_vec_isa())\n"
        "try:\n"
        "    os.waitpid(-1, os.WNOHANG)\n"
        "    print('children left')\n"
        "except ChildProcessError:\n"
        "    print('no children left')\n"
    )
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env={**_environment(tmp_path), "TORCHINDUCTOR_VEC_ISA_OK": "0"})
    output = ran.stdout + ran.stderr
    assert ran.returncode == 0, output
    assert "its precompiled header is built beside inductor's ISA probe" in output
    assert "warm-up compile failed" not in output
    assert "picked INVALID_VEC_ISA" in output and "no children left" in output
    headers = list((tmp_path / "caches").glob("torch-*/inductor/precompiled_headers/*.gch"))
    assert len(headers) == 2, headers  # the builder's guess and the pick's own


@pytest.mark.fast
def test_no_builder_where_the_headers_are_built_or_torch_keeps_none(tmp_path: Path) -> None:
    (tmp_path / "header.h.gch").touch()
    assert warmup._start_cache_builder(tmp_path) is None
    assert warmup._start_cache_builder(None) is None


@pytest.mark.fast
def test_no_builder_while_other_threads_run(tmp_path: Path) -> None:
    release = threading.Event()
    thread = threading.Thread(target=release.wait)
    thread.start()
    try:
        assert warmup._start_cache_builder(tmp_path) is None
    finally:
        release.set()
        thread.join()


def _environment(tmp_path: Path) -> dict[str, str]:
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    environment["MINIFY_CACHE_DIR"] = str(tmp_path / "caches")
    return environment
