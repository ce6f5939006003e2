"""The one place minify touches torch's compiler bisector (`torch._inductor.compiler_bisector`).

Read from torch 2.13.0's source; its tests (tests/worker/programs/fx/test_culprit.py,
tests/worker/programs/fx/test_bisector.py) pass on 2.11.0, 2.13.0 and 2.14.1 (`make test-torch-2.11`,
`make test-torch-2.14`). What we rely on:

- `CompilerBisector.do_bisect(fn)` drives the search: the first stage of `BACKENDS` (eager,
  aot_eager, aot_eager_decomp_partition, aot_eager_decomp_partition_crossref, inductor) that
  fails, then each of that stage's subsystems disabled in turn, then a bisection of the
  application count of the one whose disabling fixed it. `fn()` answers True when the program
  works in the state the bisector is in, which `get_backend`, `get_subsystem` and
  `get_run_state` tell; it returns a `BisectionResult(backend, subsystem, bisect_number,
  debug_info)`, or None when every stage works.
- Its state lives in files under `CompilerBisector.in_process_cache` (`<dir>/bisect/...`), or
  under inductor's cache dir when that is unset: a stale `bisect_status.txt` there turns
  bisection on in every later process that reads it (pytorch#143453). So `in_process_cache` is
  always set, to a directory of the job's own, in the parent and in each probe child; do_bisect
  removes it when done.
- A probe is told what to disable through the environment protocol `TORCH_BISECT_BACKEND`,
  `TORCH_BISECT_SUBSYSTEM` and `TORCH_BISECT_MAX` (-1: disable every application), as
  `python -m torch._inductor.compiler_bisector run` tells its subprocesses; while counting or
  bisecting the applications (`find_max_bounds`, `bisect`) the probe reads and writes the state
  files. `get_env_val` caches the environment per process and `bisection_enabled` is computed at
  import, so a probe forked from a process that imported the module resets both.
- Which application the bisection ended on (`debug_info`: the lowering's op, `relu`) is noted by
  the process that compiled it, a probe's child. torch 2.13 keeps the note in the state files
  (`add_call_counter_debug_info`); 2.11 and 2.12 in a module dict, `call_counter_debug_info`, which
  the bisecting process never sees: there both processes get a dict that keeps it in a state
  file too (`_DebugInfoFile`).
- A `ConfigChange` subsystem is a config patch: `get_config_change(backend)` reads it back.
  torch.compile's inductor wrapper applies it, but minify compiles with `compile_fx` directly,
  so the probe applies it (`enter_probe`'s return value); aot_eager_decomp_partition applies its
  own (cse).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CHECKED_ON = ("2.11", "2.13", "2.14")
# The bisector's stages that are backends of torch.compile (torch._dynamo's registry), in its order.
STAGE_BACKENDS = ("eager", "aot_eager", "aot_eager_decomp_partition", "aot_eager_decomp_partition_crossref")
FINAL_STAGE = "inductor"
# Which module a ConfigChange's `config_name` (a BACKENDS key) patches: inductor's config, or
# functorch's for aot_eager_decomp_partition (torch/_dynamo/backends/debugging.py patches it there).
_CONFIG_MODULE = {"inductor": "", "aot_eager_decomp_partition": "torch._functorch.config."}

# do_bisect keeps its state on the class: one bisection at a time per process.
_lock = threading.Lock()


@dataclass(frozen=True)
class Probe:
    """One call of the bisector's `fn`: compile with `backend` (a stage) with `subsystem` in
    `run_state` (test_disable, find_max_bounds, bisect), or the stage alone when None."""

    backend: str
    subsystem: str | None = None
    run_state: str | None = None
    config: tuple[tuple[str, Any], ...] = ()  # a ConfigChange's patch, as spec config keys

    def environment(self) -> dict[str, str]:
        """The environment protocol, as the bisector's `run` command sets it for its subprocess."""
        env = {"TORCH_BISECT_BACKEND": self.backend}
        if self.subsystem:
            env["TORCH_BISECT_SUBSYSTEM"] = self.subsystem
            if self.run_state == "test_disable":
                env["TORCH_BISECT_MAX"] = "-1"
        return env

    def describe(self) -> str:
        if not self.subsystem:
            return self.backend
        return f"{self.backend}/{self.subsystem} ({self.run_state})"


@dataclass(frozen=True)
class Result:
    """`BisectionResult`, as plain values."""

    backend: str
    subsystem: str | None
    bisect_number: int | None
    debug_info: str | None


def available() -> str | None:
    """Why the bisector cannot be used with this torch, or None when it can."""
    try:
        from torch._inductor.compiler_bisector import BACKENDS, CompilerBisector
    except ImportError as error:
        return f"this torch has no compiler bisector ({error})"
    missing = [name for name in ("do_bisect", "get_backend", "get_subsystem", "get_run_state", "in_process_cache")
               if not hasattr(CompilerBisector, name)]
    if missing or FINAL_STAGE not in BACKENDS:
        return f"this torch's compiler bisector is not the one minify knows (checked on torch {', '.join(CHECKED_ON)})"
    return None


def config_changes() -> list[tuple[str, str, Any]]:
    """The bisector's config changes as (stage, spec config key, value): settings a user can flip."""
    from torch._inductor.compiler_bisector import BACKENDS, ConfigChange

    changes = []
    for stage, subsystems in BACKENDS.items():
        for subsystem in subsystems:
            if isinstance(subsystem, ConfigChange) and stage in _CONFIG_MODULE:
                changes.append((stage, _CONFIG_MODULE[stage] + subsystem.config_field, subsystem.config_value))
    return changes


def config_patch(stage: str, subsystem: str | None) -> tuple[tuple[str, Any], ...]:
    """The inductor config patch of a ConfigChange subsystem of the last stage, as spec config keys
    (what the probe applies itself, `compile_fx` not reading it); () for anything else."""
    from torch._inductor.compiler_bisector import CompilerBisector, ConfigChange

    if not subsystem:
        return ()
    found = CompilerBisector.get_subsystem_object(stage, subsystem)
    if not isinstance(found, ConfigChange) or stage != FINAL_STAGE:
        return ()
    return ((found.config_field, found.config_value),)


def expected_probes() -> list[Probe]:
    """The probes do_bisect asks for first, in its order, as long as every stage before the last
    works and no subsystem of the last but its last one fixes the failure (the common case: a bug
    in inductor's lowerings): the ones worth starting ahead, in parallel. They read no state files."""
    from torch._inductor.compiler_bisector import BACKENDS

    stages = list(BACKENDS)
    probes = [Probe(stage) for stage in stages[: stages.index(FINAL_STAGE) + 1]]
    probes += [Probe(FINAL_STAGE, subsystem.name, "test_disable", config_patch(FINAL_STAGE, subsystem.name))
               for subsystem in BACKENDS[FINAL_STAGE]]
    return probes


def same_as_last_stage(probe: Probe, *, device_class: str, setting: Callable[[str], Any],
                       has_convolution: bool) -> str | None:
    """Why `probe` compiles exactly what the last stage compiles with nothing disabled (so the
    job's own run of the program already answered it), or None. Read from torch 2.13's source:

    - cudagraphs disabled: the switch is read only where cudagraphs wrap a compiled graph
      (`output_code.cudagraph_post_compile`), which needs `triton.cudagraphs` on;
    - `comprehensive_padding=False` on CPU: inductor turns it off itself for CPU inputs while
      `disable_padding_cpu` is on (`compile_fx.maybe_disable_comprehensive_padding`);
    - `layout_optimization=False` with no convolution: `GraphLowering.decide_layout_opt` turns the
      layout optimization off for a graph without one (unless `force_layout_optimization`).
    """
    if probe.backend != FINAL_STAGE:
        return None
    if probe.subsystem == "cudagraphs" and probe.run_state == "test_disable" and not setting("triton.cudagraphs"):
        return "cudagraphs are off (triton.cudagraphs): disabling them changes nothing"
    patch = dict(probe.config)
    if patch == {"comprehensive_padding": False} and device_class == "cpu" and setting("disable_padding_cpu"):
        return "inductor turns comprehensive padding off itself on CPU (disable_padding_cpu)"
    if patch == {"layout_optimization": False} and not has_convolution and not setting("force_layout_optimization"):
        return "the program has no convolution, so layout optimization is off already"
    return None


def bisect(works: Callable[[Probe], bool], state_dir: Path) -> Result | None:
    """Run torch's bisection in this process, asking `works(probe)` at each step (which runs the
    probe wherever it likes: a sandbox child); its state lives in `state_dir` (removed after).
    An exception `works` raises ends the bisection and propagates."""
    from torch._inductor.compiler_bisector import CompilerBisector

    def fn() -> bool:
        stage = CompilerBisector.get_backend()
        subsystem = CompilerBisector.get_subsystem()
        run_state = CompilerBisector.get_run_state(stage, subsystem) if stage and subsystem else None
        assert stage is not None
        return works(Probe(stage, subsystem, run_state, config_patch(stage, subsystem)))

    with _lock, _debug_info_in_files():
        saved = (CompilerBisector.bisection_enabled, CompilerBisector.in_process_cache)
        state_dir.mkdir(parents=True, exist_ok=True)
        CompilerBisector.in_process_cache = str(state_dir)
        printed = io.StringIO()
        # It narrates with print(), its cleanup included (which runs when do_bisect's frame dies:
        # on an error, when the traceback is dropped below): keep all of it off the worker's
        # stdout (`minify-worker minify --json` prints one JSON document there), in the log.
        with contextlib.redirect_stdout(printed):
            try:
                found = CompilerBisector.do_bisect(fn)
            except BaseException as error:
                # Without do_bisect's frame: its cleanup (state dir removed, class state reset) runs
                # when that frame dies, which a traceback kept alive would postpone.
                raise error.with_traceback(None) from None
            finally:
                CompilerBisector.bisection_enabled, CompilerBisector.in_process_cache = saved
                log.debug("compiler bisector: %s", printed.getvalue())
    if found is None:
        return None
    return Result(found.backend, found.subsystem, found.bisect_number, found.debug_info)


def enter_probe(environment: dict[str, str], state_dir: Path) -> None:
    """In a probe's child, before it compiles: the environment protocol, and the job's state dir
    (never inductor's cache dir). Resets what the module computed from the fork origin's environment."""
    from torch._inductor import compiler_bisector
    from torch._inductor.compiler_bisector import CompilerBisector

    os.environ.update(environment)
    compiler_bisector.get_env_val.cache_clear()
    compiler_bisector.subsystem_call_counter.clear()
    if _keeps_debug_info_in_memory(compiler_bisector):
        compiler_bisector.call_counter_debug_info = _DebugInfoFile()
    CompilerBisector.in_process_cache = str(state_dir)
    CompilerBisector.bisection_enabled = True


class _DebugInfoFile(dict):  # type: ignore[type-arg]
    """torch 2.11/2.12's `call_counter_debug_info` (application number -> what it applied to), kept
    in a state file of the bisection (`<state dir>/bisect/`), as 2.13 keeps it: a probe's child
    notes it, the bisecting process reads it when the bisection ends and clears it between
    subsystems (`reset_counters`). Lines `N=info`; the last line for N wins."""

    @staticmethod
    def _path() -> Path:
        from torch._inductor.compiler_bisector import CompilerBisector

        return Path(CompilerBisector.get_dir()) / "minify_call_counter_debug_info.txt"

    def __setitem__(self, counter: int, info: str) -> None:
        path = self._path()
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as file:
            file.write(f"{counter}={info}\n")

    def get(self, counter: int, default: Any = None) -> Any:
        try:
            lines = self._path().read_text().splitlines()
        except FileNotFoundError:
            return default
        for line in reversed(lines):
            number, _, info = line.partition("=")
            if number == str(counter):
                return info
        return default

    def clear(self) -> None:
        self._path().unlink(missing_ok=True)


def _keeps_debug_info_in_memory(compiler_bisector: Any) -> bool:
    return (not hasattr(compiler_bisector.CompilerBisector, "add_call_counter_debug_info")
            and isinstance(getattr(compiler_bisector, "call_counter_debug_info", None), dict))


@contextlib.contextmanager
def _debug_info_in_files() -> Iterator[None]:
    """In the bisecting process, for the length of a bisection: `_DebugInfoFile` where this torch
    keeps the debug info in memory; nothing on torch 2.13 and newer."""
    from torch._inductor import compiler_bisector

    if not _keeps_debug_info_in_memory(compiler_bisector):
        yield
        return
    saved = compiler_bisector.call_counter_debug_info
    compiler_bisector.call_counter_debug_info = _DebugInfoFile()
    try:
        yield
    finally:
        compiler_bisector.call_counter_debug_info = saved
