"""Warm-up and caches: making a process a fork origin (`preload`, `fork_refusal` and the at-fork
hooks that keep track of it), the imports and inductor warm-up a fork server does once for all its
children, a long-lived child's device set-up, and where compilers keep their caches.

The fork-origin state lives here and only here: read it through these functions, never a copy."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from minify_contract.models import JobSpec
from minify_worker import programs
from minify_worker.sandbox import vec_isa

log = logging.getLogger(__name__)


def compile_cache_dir(job_root: Path) -> Path:
    """Where compilers keep their caches: shared by the jobs of one machine unless told otherwise.

    Inductor's and triton's caches (and inductor's precompiled headers and CPU ISA probe) are what
    make a warm compile cost a fraction of a cold one; a per-job cache would pay the cold price in
    every job. Entries are keyed by graph, config and torch version, failed compiles are never
    cached, and builds are written whole (`whole_builds`: a child killed mid-link leaves no
    truncated library), so a shared cache cannot change an outcome. `MINIFY_CACHE_DIR` moves it;
    `MINIFY_CACHE_DIR=job` keeps it inside the job's work dir (removed with the job).
    """
    configured = os.environ.get("MINIFY_CACHE_DIR", "")
    if configured == "job":
        return job_root / "cache"
    if configured:
        base = Path(configured)
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "minify"
    import torch.version

    path = base / f"torch-{torch.version.__version__}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def compile_cache_variables(job_root: Path) -> dict[str, str]:
    """The environment that points inductor and triton at `compile_cache_dir(job_root)`."""
    caches = compile_cache_dir(job_root)
    return {"TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"), "TRITON_CACHE_DIR": str(caches / "triton")}


@contextmanager
def _compile_cache_environment() -> Iterator[None]:
    """Point inductor and triton at the machine's compile cache (as pools do) for a while."""
    wanted = compile_cache_variables(Path(tempfile.gettempdir()))
    saved = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# Set by `preload()`, in this process and (through an at-fork hook) in every process forked from
# it while it was still clean: how many native threads beyond Python's own it had then. More now
# means a native thread pool (OpenMP, most likely) started since, and a process forked from here
# would hang in its first parallel region: OpenMP's threads do not survive a fork.
_fork_origin_native_threads: int | None = None
# Whether the origin also ran inductor's CPU warm-up (ISA probe, a compile), which the fork server
# then inherits instead of running it per job.
_fork_origin_warm = False
_clean_at_fork = False


def _tqdm_locks_of_its_own() -> None:
    """In a forked process: tqdm's write lock, which every `tqdm(...)` takes for a moment (fx's
    Interpreter makes one per run), is a multiprocessing RLock, a semaphore shared with every process
    forked after it was made. A sandbox child killed while holding it (at its timeout, or a cancel)
    would leave it held for good, and the next tqdm in the worker, the fork server or any later
    child would wait forever. So each forked process gets locks of its own (a threading RLock: no
    process needs to wait for another's progress bar)."""
    std = sys.modules.get("tqdm.std")
    if std is None:
        return
    std.TqdmDefaultWriteLock.th_lock = threading.RLock()
    std.TqdmDefaultWriteLock.mp_lock = None
    std.tqdm.set_lock(std.TqdmDefaultWriteLock())


os.register_at_fork(after_in_child=_tqdm_locks_of_its_own)


def preload(warm: bool = True) -> dict[str, float]:
    """Make this process an origin the sandbox may fork its fork server from (a zygote).

    Imports torch and what the candidates need and, with `warm`, runs inductor's CPU warm-up (its
    vector-ISA probe and one compile, no kernel run) against the machine's compile cache: never
    CUDA, no tensor op, no thread. A later `SandboxPool` then forks its server from here instead of
    starting a fresh interpreter that imports and warms up all over again (seconds per job). The
    RQ worker calls it once at start and every work horse inherits it. Without it, or once this
    process has started a native thread pool or initialized CUDA (see `fork_refusal`), pools spawn
    their server.
    """
    global _fork_origin_warm
    started = time.monotonic()
    _import_compiler_modules()
    for representation in programs.preloaded():
        programs.import_modules(representation.child_modules)
    imported = time.monotonic()
    before = _native_threads_beyond_python()
    warmed = False
    if warm and os.environ.get("MINIFY_CACHE_DIR", "") != "job":
        with _compile_cache_environment():
            _warm_inductor_cpu()
        warmed = True
    timings = {"imports_s": round(imported - started, 3), "warmup_s": round(time.monotonic() - imported, 3)}
    if _native_threads_since_origin(before):
        log.warning("sandbox: the warm-up started native threads; pools will spawn their fork server")
        return timings
    if _fork_origin_native_threads is None:
        os.register_at_fork(before=_check_clean_before_fork, after_in_child=_mark_child_of_clean_origin)
    _fork_origin_warm = warmed
    _mark_fork_origin()
    return timings


def _mark_fork_origin() -> None:
    global _fork_origin_native_threads
    _fork_origin_native_threads = _native_threads_beyond_python()


def _check_clean_before_fork() -> None:
    global _clean_at_fork
    _clean_at_fork = fork_refusal() is None


def _mark_child_of_clean_origin() -> None:
    global _fork_origin_native_threads
    if _clean_at_fork:
        _mark_fork_origin()
    else:
        _fork_origin_native_threads = None


def _native_threads_beyond_python() -> int:
    try:
        tasks = len(os.listdir("/proc/self/task"))
    except OSError:
        return 1 << 30
    return tasks - threading.active_count()


def fork_refusal() -> str | None:
    """Why a fork server may not be forked from this process now (None: it may)."""
    if os.environ.get("MINIFY_SANDBOX_START", "").lower() == "spawn":
        return "MINIFY_SANDBOX_START=spawn"
    if _fork_origin_native_threads is None:
        return "this process was not preloaded"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialized in this process"
    if _jax_backend_started():
        return "jax's XLA backend started in this process (its threads would deadlock a forked child)"
    if _autograd_threads_started():
        return "autograd's device threads started in this process (a child forked from it cannot run a backward)"
    if _native_threads_since_origin(_fork_origin_native_threads):
        return "a native thread pool started in this process since preload()"
    return None


def _native_threads_since_origin(at_origin: int, settle_s: float = 0.1) -> bool:
    """Whether this process has more native threads beyond Python's than `at_origin`, for longer
    than `settle_s`: a Python thread that just ended has left `threading` a moment before its task
    leaves /proc (right after `join()`, half the time here), and counts for that moment as a
    native one; a native pool stays."""
    deadline = time.monotonic() + settle_s
    while _native_threads_beyond_python() > at_origin:
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.002)
    return False


def _autograd_threads_started() -> bool:
    """Whether autograd's engine started its device threads in this process (`pt_autograd_N`): a
    CUDA build of torch starts them at the first backward, or the first compile of a function
    whose inputs require grad (AOT autograd traces the backward), even on a machine with no GPU;
    a CPU build starts none. A child forked after that raises at its first backward ("Unable to
    handle autograd's threading in combination with fork-based multiprocessing"): a training job's
    candidates would all fail so, and the job would end not reproducible. Seen where the engine ran
    in a process that had run such a program first (a test, a notebook)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return False
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                if comm.read().startswith("pt_autograd"):
                    return True
        except OSError:  # the thread ended meanwhile
            continue
    return False


def _jax_backend_started() -> bool:
    """Whether jax made an XLA backend in this process: its thread pools are not counted by the
    native-thread check when they start after it, and a fork then deadlocks (seen with a StableHLO
    job whose parent had run XLA once)."""
    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import xla_bridge
    except ImportError:
        return False
    return bool(getattr(xla_bridge, "_backends", None))


def origin_warmed_up() -> bool:
    """Whether this process descends from a `preload()`ed origin that ran inductor's CPU warm-up
    (read at call time: the at-fork hooks keep it up to date)."""
    return _fork_origin_warm


def warm_up(spec: JobSpec) -> dict[str, Any]:
    """Import what every candidate child needs, without initializing CUDA or starting OpenMP threads.

    For inductor on the CPU it also runs `_warm_inductor_cpu`, whose results every forked child
    inherits. The server runs this right after forking its first child (prepare, which needs none
    of it), so the two overlap; a server forked from a warm `preload()`ed origin skips it.
    """
    started = time.monotonic()
    _import_compiler_modules()
    programs.import_modules(programs.of_format(spec.program_format).child_modules)
    import torch

    imported = time.monotonic()
    if spec.backend in ("inductor", "aot_inductor") and spec.device_class == "cpu":
        _warm_inductor_cpu()
    return {"imports_s": round(imported - started, 3), "warmup_s": round(time.monotonic() - started, 3),
            "cuda_initialized": bool(torch.cuda.is_initialized())}


def warm_up_device(spec: JobSpec) -> None:
    """A long-lived child's set-up, once: the CUDA context and a first compile on the job's device,
    so its first candidate does not pay for them. On the CPU a forked child inherits the server's."""
    if spec.device_class != "cuda":
        return
    import torch

    device = torch.device(spec.device)
    if device.index is not None:  # plain "cuda" is the current device; set_device wants an index
        torch.cuda.set_device(device)
    torch.empty(1, device=device)
    if spec.backend in ("inductor", "aot_inductor"):
        _compile_warm_up_graph(device)


def gpu_present() -> bool:
    """Whether this machine has a CUDA device, asked without initializing CUDA in this process.

    With `PYTORCH_NVML_BASED_CUDA_CHECK=1` (set by importing `minify_worker`) torch asks NVML;
    without it, `torch.cuda.is_available()` would initialize CUDA and poison every later fork, so
    the driver's files are looked at instead.
    """
    import torch

    if os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") == "1":
        return bool(torch.cuda.is_available())
    return Path("/proc/driver/nvidia").exists() or any(Path("/dev").glob("nvidia[0-9]*"))


def _warm_inductor_cpu() -> None:
    """Inductor's vector-ISA probe (a few small C++ builds, each checked by a `python -c` dlopen
    subprocess; cached in this process, its passing builds taken from the compile cache's record:
    `vec_isa`) and a compile-only warm-up (`_compile_warm_up_graph`).

    On a machine with a GPU the compile is skipped: aot_autograd saves the CUDA RNG state around
    every compile (`preserve_rng_state` -> `torch.cuda.get_rng_state`), which initializes CUDA in
    this process and makes CUDA unusable in every child forked from it, CPU jobs' included.
    """
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = 1
    headers = keep_precompiled_headers_with_the_caches()
    caches = inductor_cache_dir()  # the vec-ISA record lives there too
    if gpu_present():
        vec_isa.pick_vec_isa_remembered(caches)
        log.info("sandbox: a GPU is present: no warm-up compile in a process that forks candidates")
        return
    builder = _start_cache_builder(headers)
    vec_isa.pick_vec_isa_remembered(caches)
    _compile_warm_up_graph()
    if builder is not None:
        _reap_cache_builder(builder)


def inductor_cache_dir() -> Path | None:
    """The compile cache inductor uses in this process (`TORCHINDUCTOR_CACHE_DIR`), None where unset."""
    caches = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    return Path(caches) if caches else None


def keep_precompiled_headers_with_the_caches() -> Path | None:
    """Point inductor's precompiled headers, and their locks, at the compile cache
    (`TORCHINDUCTOR_CACHE_DIR`), where this process compiles for a sandbox; the folder (None where
    this torch keeps no headers or no cache is set).

    Torch keeps them under its default cache folder in the temp dir, and the sandbox's temp dir is
    the job's: each job, and each child of a sandbox whose server did not warm up (a custom backend
    that compiles with inductor, a pool started without warm-up, a spawned server's first
    children), built its own, 10-25 s of g++ per header here. Kept with the kernels they are built
    once per machine and toolchain (inductor keys a header by its flags, compiler and preprocessed
    source). Idempotent and cheap: the warm-up and every candidate child call it."""
    import torch._inductor.codecache as codecache

    caches = inductor_cache_dir()
    if caches is None or not hasattr(codecache, "_HEADER_DIR"):
        return None
    headers = caches / "precompiled_headers"
    codecache._HEADER_DIR = str(headers)
    if hasattr(codecache, "_HEADER_LOCK_DIR"):
        codecache._HEADER_LOCK_DIR = str(headers / "locks")
    return headers


def _start_cache_builder(headers: Path | None) -> int | None:
    """On a machine whose compile cache is cold, fork a child that builds what the warm-up compile
    will need (the precompiled header, the warm-up graph's kernel) while this process runs
    inductor's vector-ISA probe: two single-threaded chains of C++ builds, about 5 s each, side by
    side instead of one after the other. The child takes the ISAs the CPU claims as valid without
    probing (`cpp.vec_isa_ok`), so it builds with the flags the probe will pick wherever the probe
    accepts what the CPU claims; inductor's builds are keyed by source and flags and taken under a
    file lock, so the warm-up compile here waits for the child's build or finds it done, and a
    guess the probe contradicts costs only its CPU time. This process's own state is untouched: the
    child compiles in its copy and exits.

    Not started where the precompiled headers exist already (a warm cache: nothing to gain), where
    this torch keeps none, or where this process runs threads besides its own (a fork would copy
    their locks as they stand).
    """
    if headers is None or any(headers.glob("*.gch")) or threading.active_count() > 1:
        return None
    try:
        pid = os.fork()
    except OSError:
        return None
    if pid:
        log.info("sandbox: the compile cache is cold: its precompiled header is built beside inductor's ISA probe "
                 "(pid %d)", pid)
        return pid
    status = 1
    try:
        import torch._inductor.config as inductor_config

        inductor_config.cpp.vec_isa_ok = True
        logging.disable(logging.WARNING)  # a failed guess is this process's to say, not the child's
        _compile_warm_up_graph()
        status = 0
    finally:
        os._exit(status)


def _reap_cache_builder(pid: int, timeout_s: float = 120.0) -> None:
    """Wait for the cache builder (it ends with the builds this process just waited for, or soon
    after); one still running past `timeout_s` is killed, as a build that slow helps no one."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            if status:
                log.info("sandbox: the compile-cache builder ended with status %d (nothing lost: this process "
                         "built what it needed)", status)
            return
        time.sleep(0.05)
    log.warning("sandbox: the compile-cache builder ran past %.0f s: killed", timeout_s)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def _import_compiler_modules() -> None:
    """What every candidate child imports, whatever its program: torch, dynamo, inductor's
    compiler, export (a representation's own modules: `Representation.child_modules`)."""
    import torch
    import torch._dynamo
    import torch._inductor.codecache
    import torch._inductor.compile_fx
    import torch._inductor.cpu_vec_isa
    import torch.export  # noqa: F401

    from .whole_builds import install

    install()  # a child killed mid-link must not leave a truncated kernel in the shared cache


def _compile_warm_up_graph(device: Any = "cpu") -> None:
    """Compile (never run) a tiny graph, so children inherit inductor's lazily built state.

    Measured here: a candidate's first compile in a fresh child goes from about 2.1 s to 1.2 s.
    It runs no kernel (no OpenMP pool) and starts no thread (compile_threads=1); every child
    starts from the same state, so it cannot make one candidate's outcome depend on another.
    """
    import torch
    from torch._inductor.compile_fx import compile_fx

    def warm_up_graph(x: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.sin(x) + 1,)

    try:
        with torch.no_grad():
            compile_fx(torch.fx.symbolic_trace(warm_up_graph), [torch.empty(4, 4, device=device)])
    except Exception:  # a warm-up is an optimization: a broken one must not stop the job
        log.warning("inductor warm-up compile failed", exc_info=True)
