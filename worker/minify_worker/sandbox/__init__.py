"""Run candidates in child processes forked from a warm fork server (docs/architecture.md, "Isolation model").

Processes::

    parent (engine)                      fork server (python -m minify_worker.sandbox)
      SandboxPool ──requests (pipe)──▶     imports torch + inductor, never CUDA, no tensor ops
                  ◀──events (pipe)────     loads values.pt (mmap, weights_only)
                                           forks one child per request ──▶ child: setsid, run, write result, _exit

The parent talks to the server over two private pipes (JSON lines), never over stdout: children
inherit stdout, and user code prints. The server is the only one that forks, waits and kills, so
a pid can never be reused under it: it enforces each request's timeout, kills a child's whole
process group (`os.killpg`: the child and what it started, e.g. a C++ compiler) on timeout,
cancel or shutdown, reaps every child (it is a child subreaper, so orphaned grandchildren come
back to it), and reports how each child ended. A killed parent leaves nothing behind: the server
has `PR_SET_PDEATHSIG=SIGKILL` towards the pool's I/O thread, every child towards the server,
and a tiny guardian process (forked by the server before it imports torch) kills the process
group of every child still registered with it when the server dies, so that what a child
started (a compiler, a `sleep`) dies too.

Everything the pool writes lives under `workdir/sandbox/` (result files, child logs, TMPDIR,
inductor and triton caches) and `close()` removes it; the rest of `workdir` is the caller's.

API (parent side)::

    pool = SandboxPool(workdir, values_path, spec, parallelism)   # values_path may be None
    future = pool.submit(wire_graph, timeout_s, purpose="candidate")   # Future[Outcome]
    pool.cancel(future)               # or future.cancel(): kills that child
    pool.set_timeout(future, 30.0)    # a new timeout for a queued or running request
    value = pool.call("minify_worker.environment:collect_in_child", kwargs, timeout_s)   # -> dict
    pool.load_values(values_path)     # (re)load the value store in the server, e.g. after prepare
    pool.wait_ready(timeout_s)        # -> the server's warm-up report
    pool.close()                      # kills everything, reaps, removes workdir/sandbox

A call target is a module-level function of `minify_worker` called in a child as
`fn(context: ChildContext, **kwargs) -> dict` (JSON-safe); the context carries the value store.
Both the pool and the child refuse any other module unless the pool's environment names its
prefix in `MINIFY_ALLOWED_CALLS` (the tests do, for tests/support/calls.py).
How a child ended becomes an `Outcome` in the pool: its reported outcome, else `TimedOut` (killed
at its deadline), `Crashed(signal)`, `OutOfMemory` for an unexplained SIGKILL (the kernel's OOM
killer), or `Crashed(0, ExitStatus)` for an exit without a report.

Modules, one concept each::

    pool.py       the parent's side: SandboxPool, its exceptions, events -> outcomes, prepare_program
    server.py     the fork server: options and entry points, its loop, deadlines, memory watch, reaping
    child.py      what a child does: enter, confine, run a request to a result file, the long-lived loop
    processes.py  process plumbing: prctl, forking detached, the guardian, kill a group, descriptors
    warmup.py     preload and fork_refusal (the fork-origin state), warm-up, compile caches
    limits.py     memory bounds, rlimits, the scrubbed environment, candidates per long-lived child
    __main__.py   `python -m minify_worker.sandbox`: the spawned fork server
"""

from .child import ALLOWED_CALLS_ENV, CALL_PREFIX, REUSE_MEMORY_GROWTH_MB, ChildContext, call_allowed
from .limits import (
    ADDRESS_SPACE_SLACK_MB,
    CHILD_OPEN_FILES,
    default_memory_bound_mb,
    default_reuse,
    machine_memory_mb,
    scrubbed_environment,
    usable_cores,
)
from .pool import (
    PrepareStopped,
    SandboxCallError,
    SandboxError,
    SandboxFault,
    SandboxPool,
    outcome_of_child,
    prepare_program,
    sandbox_fault_of,
    wait_unless_stopped,
)
from .server import MAX_WORKER_START_FAILURES, MEMORY_CHECK_INTERVAL_S
from .warmup import compile_cache_dir, fork_refusal, gpu_present, preload, warm_up, warm_up_device

__all__ = [
    "ADDRESS_SPACE_SLACK_MB",
    "ALLOWED_CALLS_ENV",
    "CALL_PREFIX",
    "CHILD_OPEN_FILES",
    "MAX_WORKER_START_FAILURES",
    "MEMORY_CHECK_INTERVAL_S",
    "REUSE_MEMORY_GROWTH_MB",
    "ChildContext",
    "PrepareStopped",
    "SandboxCallError",
    "SandboxError",
    "SandboxFault",
    "SandboxPool",
    "call_allowed",
    "compile_cache_dir",
    "default_memory_bound_mb",
    "default_reuse",
    "fork_refusal",
    "gpu_present",
    "machine_memory_mb",
    "outcome_of_child",
    "preload",
    "prepare_program",
    "sandbox_fault_of",
    "scrubbed_environment",
    "usable_cores",
    "wait_unless_stopped",
    "warm_up",
    "warm_up_device",
]
