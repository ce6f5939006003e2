"""`SandboxPool.call` targets for the tests: `fn(context, **kwargs) -> dict`, run in a sandbox child.

A child calls a target outside `minify_worker` only when the pool's environment allows its module
(`MINIFY_ALLOWED_CALLS`), so tests make their pools with `env=ALLOWED` (the repo root on
PYTHONPATH, as tests/conftest.py puts it, lets children import this module).
"""

from __future__ import annotations

import os
import signal
from typing import Any

from minify_worker.sandbox import ALLOWED_CALLS_ENV, ChildContext

PREFIX = "tests.support.calls"
ALLOWED = {ALLOWED_CALLS_ENV: PREFIX}


def echo(context: ChildContext, **kwargs: Any) -> dict[str, Any]:
    """Its arguments and the child's pid."""
    return {"kwargs": kwargs, "pid": os.getpid()}


def value_names(context: ChildContext) -> dict[str, Any]:
    """The names in the value store the child sees."""
    return {"names": sorted(context.values)}


def temp_dir(context: ChildContext) -> dict[str, Any]:
    """Where the child's temporary files and inductor caches go."""
    import tempfile

    return {"tempdir": tempfile.gettempdir(), "inductor_cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR")}


def gc_state(context: ChildContext) -> dict[str, Any]:
    """How many objects the child's collector holds frozen (inherited) and how many it tracks."""
    import gc

    return {"frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects())}


def run_with_spec(context: ChildContext, *, wire_graph: dict[str, Any], spec_json: str) -> dict[str, Any]:
    """Run a candidate under another spec (tests reuse one warm pool)."""
    from minify_contract.models import JobSpec
    from minify_worker.outcomes import outcome_to_dict
    from minify_worker.programs.fx.run import run_wire_candidate

    spec = JobSpec.model_validate_json(spec_json)
    return outcome_to_dict(run_wire_candidate(wire_graph, context.values, spec, context.workdir))


def crash_in_call(context: ChildContext) -> dict[str, Any]:
    """Segfaults."""
    os.kill(os.getpid(), signal.SIGSEGV)
    return {}


def inductor_config_values(context: ChildContext, keys: list[str]) -> dict[str, Any]:
    """These `torch._inductor.config` values as a child sees them."""
    import torch._inductor.config as inductor_config

    return {key: getattr(inductor_config, key) for key in keys}


def hold_tqdm_lock(context: ChildContext) -> dict[str, Any]:
    """Takes tqdm's write lock (as every `tqdm(...)` does for a moment: fx's Interpreter makes one
    per run) and never lets go: the pool kills the child at its timeout."""
    import time

    from tqdm import tqdm

    tqdm.get_lock().acquire()
    time.sleep(600)
    return {}


def make_tqdm(context: ChildContext) -> dict[str, Any]:
    """Makes a (disabled) tqdm, as fx's Interpreter does on every run: it takes tqdm's write lock."""
    from tqdm import tqdm

    tqdm(disable=True)
    return {"made": True}
