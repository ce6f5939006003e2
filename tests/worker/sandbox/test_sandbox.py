"""The sandbox: every candidate in its own child of a warm fork server; a dead child is a result.

One module-scoped pool runs the test backend `misbehave_by_op`, which fails a different way per
op (relu: compile error, neg: runtime error, sin: SIGSEGV, tanh: hang with a grandchild, exp:
exit without a report, sigmoid: out of memory), so a one-op graph picks the misbehaviour.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from minify_contract.models import JobSpec
from minify_worker.outcomes import Crashed, Fails, Invalid, OutOfMemory, Passes, TimedOut
from minify_worker.programs.fx.graph import graph_to_wire
from minify_worker.sandbox import SandboxCallError, SandboxPool, call_allowed, compile_cache_dir, preload
from minify_worker.sandbox.processes import process_stats
from minify_worker.sandbox.warmup import (
    _autograd_threads_started,
    _native_threads_beyond_python,
    _native_threads_since_origin,
)
from tests.support import backends, calls
from tests.support.graphs import chain_graph, marked_kernel

BACKEND = f"{backends.PREFIX}:misbehave_by_op"
# What the pools here may import in their children: the test backends and test call targets.
ALLOWED = {**backends.ALLOWED, **calls.ALLOWED}


def chain(*ops: str) -> dict:
    """The wire form of x → ops... → output, with x read from the value store."""
    return graph_to_wire(chain_graph(*ops))


def session_members(session_id: int) -> list[int]:
    """Pids of live processes in session `session_id` (each child is a session and group leader)."""
    return [pid for pid, fields in process_stats() if int(fields[3]) == session_id and fields[0] != "Z"]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_until(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sandbox")
    torch.save({"x": torch.randn(4, 4)}, path / "values.pt")
    return path


@pytest.fixture(scope="module")
def preloaded() -> None:
    """This process made a fork origin, as a worker makes itself (the imports, no warm-up: the test
    backend compiles nothing), so that the pools here fork their servers from it instead of each
    spawning one that imports torch afresh. The spawned path keeps its tests: the killed parent's,
    the fork origin's after OpenMP, and closing a server that is still starting."""
    preload(warm=False)


@pytest.fixture(scope="module")
def pool(workdir: Path, preloaded: None) -> Iterator[SandboxPool]:
    spec = JobSpec(backend=BACKEND)
    with SandboxPool(workdir, workdir / "values.pt", spec, parallelism=2, env=ALLOWED) as sandbox:
        sandbox.wait_ready(180)
        yield sandbox


def test_a_candidate_that_compiles_and_runs_passes(pool: SandboxPool) -> None:
    assert isinstance(pool.submit(chain("abs"), timeout_s=60).result(), Passes)


def test_a_compile_error_comes_back_as_its_signature(pool: SandboxPool) -> None:
    outcome = pool.submit(chain("relu"), timeout_s=60).result()
    assert isinstance(outcome, Fails)
    assert (outcome.signature.kind, outcome.signature.exc_type) == ("compile_error", "RuntimeError")
    assert outcome.signature.key == "injected failure on relu"


def test_an_error_while_running_is_a_runtime_error(pool: SandboxPool) -> None:
    outcome = pool.submit(chain("neg"), timeout_s=60).result()
    assert isinstance(outcome, Fails) and outcome.signature.kind == "runtime_error"


def test_a_segfaulting_child_is_crashed_with_sigsegv(pool: SandboxPool) -> None:
    outcome = pool.submit(chain("sin"), timeout_s=60).result()
    assert isinstance(outcome, Crashed)
    assert outcome.signal == signal.SIGSEGV and outcome.signature.exc_type == "SIGSEGV"


def test_a_child_that_segfaults_leaves_its_python_stack_in_what_it_printed(pool: SandboxPool) -> None:
    # What a crashed original shows its user (a job it did not reproduce): on an H200, plain torch
    # 2.11's aoti_load_package died so, and the stack named torch's _load_aoti.
    outcome = pool.submit(chain("cosh"), timeout_s=60, output=True).result()
    assert isinstance(outcome, Crashed) and outcome.signal == signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in outcome.output
    assert re.search(r'File ".*/tests/support/backends\.py", line \d+ in backend', outcome.output), outcome.output


def test_a_child_that_exits_without_reporting_is_crashed_with_its_exit_status(pool: SandboxPool) -> None:
    outcome = pool.submit(chain("exp"), timeout_s=60).result()
    assert isinstance(outcome, Crashed)
    assert (outcome.signal, outcome.signature.exc_type, outcome.signature.key) == (0, "ExitStatus", "3")


def test_running_out_of_memory_is_out_of_memory_not_a_failure(pool: SandboxPool) -> None:
    assert isinstance(pool.submit(chain("sigmoid"), timeout_s=60).result(), OutOfMemory)


def test_a_hanging_child_times_out_and_its_whole_group_dies(pool: SandboxPool) -> None:
    started = time.monotonic()
    future = pool.submit(chain("tanh"), timeout_s=1.5)
    outcome = future.result(timeout=60)
    assert isinstance(outcome, TimedOut)
    assert 1.5 <= outcome.after_s < 10 and time.monotonic() - started < 15
    pid = pool.child_pid(future)
    assert pid is not None
    assert wait_until(lambda: not session_members(pid)), "the child or its `sleep` grandchild outlived it"


def test_a_timeout_can_be_shortened_while_the_child_runs(pool: SandboxPool) -> None:
    # The engine starts candidates before the original's runs have calibrated the timeout.
    future = pool.submit(chain("tanh"), timeout_s=600)
    assert wait_until(lambda: pool.child_pid(future) is not None, 60)
    pool.set_timeout(future, 1.0)
    outcome = future.result(timeout=60)
    assert isinstance(outcome, TimedOut) and 1.0 <= outcome.after_s < 10


def test_cancel_kills_the_running_child(pool: SandboxPool) -> None:
    future = pool.submit(chain("tanh"), timeout_s=120)
    assert wait_until(lambda: pool.child_pid(future) is not None)
    pid = pool.child_pid(future)
    assert pool.cancel(future) and future.cancelled()
    assert wait_until(lambda: not session_members(pid))


def test_children_run_in_parallel(pool: SandboxPool) -> None:
    started = time.monotonic()
    futures = [pool.submit(chain("tanh"), timeout_s=3) for _ in range(2)]
    assert all(isinstance(future.result(timeout=60), TimedOut) for future in futures)
    assert time.monotonic() - started < 5.5, "two 3 s hangs with parallelism 2 ran one after the other"


def test_more_requests_than_parallelism_queue_and_all_finish(pool: SandboxPool) -> None:
    futures = [pool.submit(chain(op), timeout_s=60) for op in ("abs", "relu", "sin", "abs", "neg")]
    kinds = [future.result(timeout=120).kind for future in futures]
    assert kinds == ["passes", "fails", "crashed", "passes", "fails"]


def test_call_runs_a_function_in_a_child_with_the_value_store(pool: SandboxPool) -> None:
    assert pool.call("tests.support.calls:value_names", timeout_s=60) == {"names": ["x"]}
    echoed = pool.call("tests.support.calls:echo", {"a": 1}, timeout_s=60)
    assert echoed["kwargs"] == {"a": 1} and echoed["pid"] != os.getpid()


def test_a_crashing_call_raises_sandbox_call_error(pool: SandboxPool) -> None:
    with pytest.raises(SandboxCallError) as raised:
        pool.call("tests.support.calls:crash_in_call", timeout_s=60)
    assert raised.value.error_type == "crashed" and "SIGSEGV" in str(raised.value)


def test_an_outcome_call_resolves_with_the_outcome_its_target_returned(pool: SandboxPool) -> None:
    spec_json = JobSpec(backend=BACKEND).model_dump_json()
    outcome = pool.submit_outcome_call("tests.support.calls:run_with_spec",
                                       {"wire_graph": chain("relu"), "spec_json": spec_json}, timeout_s=60).result()
    assert isinstance(outcome, Fails) and outcome.signature.kind == "compile_error"


def test_an_outcome_call_whose_child_crashes_is_the_crash_as_a_candidates_would_be(pool: SandboxPool) -> None:
    outcome = pool.submit_outcome_call("tests.support.calls:crash_in_call", timeout_s=60).result()
    assert isinstance(outcome, Crashed) and outcome.signal == signal.SIGSEGV
    assert outcome.signature == pool.submit(chain("sin"), timeout_s=60).result().signature


def test_an_outcome_call_whose_child_hangs_times_out(pool: SandboxPool) -> None:
    spec_json = JobSpec(backend=BACKEND).model_dump_json()
    outcome = pool.submit_outcome_call("tests.support.calls:run_with_spec",
                                       {"wire_graph": chain("tanh"), "spec_json": spec_json}, timeout_s=3).result()
    assert isinstance(outcome, TimedOut)


def test_an_outcome_call_whose_target_raises_is_invalid(pool: SandboxPool) -> None:
    outcome = pool.submit_outcome_call("tests.support.calls:value_names", {"unexpected": 1}, timeout_s=60).result()
    assert isinstance(outcome, Invalid) and outcome.message.startswith("TypeError: ")


def test_call_targets_outside_minify_worker_are_refused(pool: SandboxPool) -> None:
    with pytest.raises(ValueError, match="minify_worker"):
        pool.call("os:system", {"command": "true"})


def test_call_targets_of_the_tests_need_the_pools_opt_in() -> None:
    assert call_allowed("minify_worker.engine.artifacts:write_minimized", {})
    assert not call_allowed("tests.support.calls:echo", {})
    assert call_allowed("tests.support.calls:echo", calls.ALLOWED)
    assert not call_allowed("os:system", calls.ALLOWED)


def test_children_keep_temporary_files_in_the_work_dir(pool: SandboxPool, workdir: Path) -> None:
    where = pool.call("tests.support.calls:temp_dir", timeout_s=60)
    assert Path(where["tempdir"]).is_relative_to(workdir)


def test_a_childs_collections_walk_only_what_it_made(pool: SandboxPool) -> None:
    """What a child inherits from its fork server (torch's modules, the preloaded state) is frozen
    before anything runs: a collection in the child, automatic or a long-lived child's between
    candidates, would otherwise walk all of it (and write to every page it walks)."""
    state = pool.call("tests.support.calls:gc_state", timeout_s=60)
    assert state["frozen"] > 10 * state["tracked"], state


def test_compile_caches_are_shared_outside_temp_unless_kept_per_job(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINIFY_CACHE_DIR", str(tmp_path / "caches"))
    assert compile_cache_dir(tmp_path / "job").is_relative_to(tmp_path / "caches")
    monkeypatch.setenv("MINIFY_CACHE_DIR", "job")
    assert compile_cache_dir(tmp_path / "job") == tmp_path / "job" / "cache"


def test_the_fork_server_never_initializes_cuda(pool: SandboxPool) -> None:
    assert pool.wait_ready(0)["cuda_initialized"] is False


def test_close_kills_children_and_removes_the_sandbox_dir(preloaded: None, tmp_path: Path) -> None:
    torch.save({"x": torch.randn(2)}, tmp_path / "values.pt")
    sandbox = SandboxPool(tmp_path, tmp_path / "values.pt", JobSpec(backend=BACKEND), parallelism=1, warm=False,
                          env=ALLOWED)
    future = sandbox.submit(chain("tanh"), timeout_s=300)
    assert wait_until(lambda: sandbox.child_pid(future) is not None, 120)
    pid, server = sandbox.child_pid(future), sandbox.server_pid
    sandbox.close()
    assert future.cancelled()
    assert not session_members(pid) and not alive(server)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["values.pt"]


def test_closing_a_spawned_fork_server_that_is_still_starting_does_not_wait_for_its_start(tmp_path: Path) -> None:
    """A job cancelled while its spawned server still imports torch: the server reads no request
    (not even the EOF that tells it to go) until it has started, seconds later; close stops it."""
    sandbox = SandboxPool(tmp_path, None, JobSpec(backend="inductor"), start="spawn")
    assert wait_until(lambda: sandbox.server_pid is not None, 30)
    server = sandbox.server_pid
    started = time.monotonic()
    sandbox.close()
    took = time.monotonic() - started
    assert not alive(server) and not (tmp_path / "sandbox").exists()
    assert took < 2.0, f"close took {took:.1f} s"  # it waited for the server's imports: 2.8 s on a quiet box


FORK_ORIGIN = textwrap.dedent("""
    import json, sys, threading, time, torch
    from pathlib import Path
    from tqdm import tqdm
    from minify_contract.models import JobSpec
    from minify_worker import programs
    from minify_worker.programs.fx.graph import graph_to_wire
    from minify_worker.sandbox import SandboxCallError, SandboxPool, fork_refusal, preload
    from tests.support.graphs import chain_graph, marked_kernel

    workdir = Path(sys.argv[1])
    torch.save({"x": torch.randn(4, 4)}, workdir / "values.pt")
    tqdm(disable=True)  # tqdm's locks exist before any fork (fx's Interpreter makes one per run)
    report = {"before_preload": fork_refusal()}
    preload(warm=False)
    report["after_preload"] = fork_refusal()
    before = set(sys.modules)
    fx = programs.of_format("pt2")
    fx.check_upload(workdir / "unread.pt2", JobSpec(backend="eager"))  # a spec without op_modules reads no program
    fx.set_up_children(JobSpec(backend="eager"))
    report["imported_setting_up_a_job"] = sorted(set(sys.modules) - before)
    ALLOWED = {"MINIFY_ALLOWED_BACKENDS": "tests.support.backends", "MINIFY_ALLOWED_CALLS": "tests.support.calls"}

    def run_some() -> dict:
        with SandboxPool(workdir, workdir / "values.pt", JobSpec(backend=sys.argv[2]), parallelism=2,
                         env=ALLOWED) as pool:
            # tanh hangs until this timeout (the server times each child, however long the server took to start).
            futures = {op: pool.submit(graph_to_wire(chain_graph(op)), timeout_s=2) for op in ("abs", "sin", "tanh")}
            config = pool.call("tests.support.calls:inductor_config_values", {"keys": ["compile_threads"]})
            kinds = {op: future.result().kind for op, future in futures.items()}
            return {"start": pool.start_method, **config, **kinds}

    def kill_one_holding_tqdms_lock() -> dict:
        with SandboxPool(workdir, None, JobSpec(backend="eager"), env=ALLOWED) as pool:
            try:
                pool.call("tests.support.calls:hold_tqdm_lock", timeout_s=1.5)
                killed = "not killed"
            except SandboxCallError as error:
                killed = f"killed: {error}"
            try:
                later = "made" if pool.call("tests.support.calls:make_tqdm", timeout_s=20)["made"] else "?"
            except SandboxCallError:
                later = "blocked"
            return {"start": pool.start_method, "killed": killed, "later_child": later}

    def hang_until_killed(name: str) -> dict:  # a pool left open, its child hanging with a grandchild
        (workdir / name).mkdir()
        pool = SandboxPool(workdir / name, workdir / "values.pt", JobSpec(backend=sys.argv[2]), warm=False, env=ALLOWED)
        future = pool.submit(graph_to_wire(chain_graph("tanh")), timeout_s=300)
        while pool.child_pid(future) is None:
            time.sleep(0.05)
        return {"start": pool.start_method, "server": pool.server_pid, "child": pool.child_pid(future)}

    # From another thread than preload's: inductor keeps config overrides per thread context.
    thread = threading.Thread(target=lambda: report.update(preloaded=run_some()))
    thread.start()
    thread.join()
    report["tqdm"] = kill_one_holding_tqdms_lock()
    made = threading.Thread(target=lambda: tqdm(disable=True), daemon=True)
    made.start()
    made.join(20)
    report["tqdm"]["origin"] = "blocked" if made.is_alive() else "made"
    hanging = [hang_until_killed("forked")]
    torch.set_num_threads(2)
    torch.ones(1 << 22).sin().sum()  # starts OpenMP's pool: a fork from here would hang in the next one
    report["after_openmp"] = fork_refusal()
    report["after_openmp_pool"] = run_some()
    hanging.append(hang_until_killed("spawned"))
    report["hanging"] = hanging
    print(json.dumps(report), flush=True)
    time.sleep(300)
""")


@pytest.fixture(scope="module")
def fork_origin(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One preloaded process (a fork origin) that runs pools before and after a native thread pool
    starts in it, kills a child holding tqdm's lock in between, and is then killed itself with a
    hanging candidate in a forked fork server's child and one in a spawned one's; its report. One
    process for the tests below: each such process imports torch and preloads, seconds of CPU, and
    a spawned server as much again."""
    directory = tmp_path_factory.mktemp("origin")
    with open(directory / "stderr", "w+") as stderr:
        parent = subprocess.Popen([sys.executable, "-c", FORK_ORIGIN, str(directory), BACKEND],
                                  stdout=subprocess.PIPE, stderr=stderr, text=True,
                                  cwd=Path(__file__).resolve().parents[3])
        try:
            line = parent.stdout.readline()
            if not line:
                parent.wait(60)
                stderr.seek(0)
                raise AssertionError(f"the fork origin exited {parent.returncode}: {stderr.read()[-3000:]}")
            report = json.loads(line)
            for hanging in report["hanging"]:
                assert alive(hanging["server"]) and alive(hanging["child"])
                assert wait_until(lambda hanging=hanging: len(session_members(hanging["child"])) >= 2), \
                    "the hang's grandchild did not start"
        finally:
            parent.kill()
            parent.wait()
    return report


def test_a_preloaded_process_forks_its_fork_server_until_a_native_thread_pool_starts(fork_origin: dict) -> None:
    report = fork_origin
    assert report["before_preload"] == "this process was not preloaded"
    assert report["after_preload"] is None
    outcomes = {"abs": "passes", "sin": "crashed", "tanh": "timed_out", "compile_threads": 1}
    assert report["preloaded"] == {"start": "fork", **outcomes}
    assert "native thread pool" in report["after_openmp"]
    assert report["after_openmp_pool"] == {"start": "spawn", **outcomes}


def test_a_preloaded_process_sets_up_a_jobs_sandbox_without_importing_anything(fork_origin: dict) -> None:
    """What the engine's process and the fork server import for a job's program (FX: the spec's
    op_modules, through op_modules.py, which imports minify_client's package) is the preload's: an
    RQ worker's work horse and its fork server inherit it rather than import it each (a quarter of
    a CPU-s in each, per job)."""
    assert fork_origin["imported_setting_up_a_job"] == []


def test_a_child_killed_holding_tqdms_lock_blocks_neither_the_origin_nor_later_children(fork_origin: dict) -> None:
    """tqdm's write lock is a semaphore shared with every process forked after it was made; a
    candidate killed inside fx's Interpreter (its tqdm) would leave it held, and the worker's next
    tqdm (or any later child's) would wait forever: each forked process gets locks of its own."""
    tqdm = fork_origin["tqdm"]
    assert tqdm["start"] == "fork"
    assert tqdm["killed"].startswith("killed:"), tqdm
    assert (tqdm["origin"], tqdm["later_child"]) == ("made", "made"), tqdm


@pytest.mark.parametrize("start", ["spawn", "fork"])
def test_a_killed_parent_leaves_no_orphans(fork_origin: dict, start: str) -> None:
    # The fork origin above, killed with a candidate hanging in each kind of fork server's child.
    [hanging] = [hanging for hanging in fork_origin["hanging"] if hanging["start"] == start]
    server, child = hanging["server"], hanging["child"]
    assert wait_until(lambda: not alive(server) and not session_members(child))


JAX_ORIGIN = textwrap.dedent("""
    import json, jax.numpy
    from minify_worker.sandbox import fork_refusal, preload

    jax.numpy.ones(2).block_until_ready()  # makes jax's CPU backend, and its threads, before preload
    preload(warm=False)
    print(json.dumps({"after_preload": fork_refusal()}), flush=True)
""")


def _origin_report(script: str) -> dict:
    """Run `script` (a would-be fork origin) in a fresh interpreter from the repo root: the JSON it printed last."""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[3])
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_process_that_started_jax_backend_spawns_its_fork_server() -> None:
    # Started before preload, jax's threads count as the origin's own: only asking jax tells.
    pytest.importorskip("jax", reason="jax is the hlo extra's (make test installs it; a torch-version venv need not)")
    report = _origin_report(JAX_ORIGIN)
    assert report["after_preload"] == "jax's XLA backend started in this process (its threads would deadlock a " \
                                      "forked child)"


AUTOGRAD_ORIGIN = textwrap.dedent("""
    import json, torch
    from minify_worker.sandbox import fork_refusal, preload
    from minify_worker.sandbox.warmup import _autograd_threads_started

    step = torch.compile(lambda x: (x.sin() * 2).sum(), backend="aot_eager")
    step(torch.ones(3, requires_grad=True)).backward()  # a training step, as a test or a notebook runs one
    preload(warm=False)
    print(json.dumps({"threads": _autograd_threads_started(), "after_preload": fork_refusal()}), flush=True)
""")


def test_a_process_whose_autograd_started_its_device_threads_spawns_its_fork_server() -> None:
    """A CUDA build of torch (the GPU machines', even with no GPU) starts autograd's device threads
    at a training step's compile; a child forked after that cannot run a backward, so every
    candidate of a training job failed with autograd's fork error and the job ended not
    reproducible. Started before preload, the threads count as the origin's own: their names tell."""
    report = _origin_report(AUTOGRAD_ORIGIN)
    if not report["threads"]:
        assert torch.version.cuda is None  # a CPU build starts none: forking stays safe
        pytest.skip("this CPU build of torch starts no autograd device threads (CUDA builds do)")
    assert report["after_preload"] == ("autograd's device threads started in this process (a child forked from "
                                       "it cannot run a backward)")


@pytest.mark.fast
def test_autograd_device_threads_are_told_by_their_names() -> None:
    """What `fork_refusal` looks for: a native thread named as autograd's engine names its device
    threads (`pt_autograd_N`), here one this test names so, gone once it ends."""
    started, release = threading.Event(), threading.Event()

    def named_as_autograds() -> None:
        ctypes.CDLL(None).prctl(15, b"pt_autograd_0", 0, 0, 0)  # PR_SET_NAME: this thread's comm
        started.set()
        release.wait()

    thread = threading.Thread(target=named_as_autograds)
    assert not _autograd_threads_started()
    thread.start()
    try:
        assert started.wait(10) and _autograd_threads_started()
    finally:
        release.set()
        thread.join()
    deadline = time.monotonic() + 10  # join() returns as Python lets go of it; the native thread ends just after
    while _autograd_threads_started():
        assert time.monotonic() < deadline, "the thread named as autograd's still listed after it ended"
        time.sleep(0.01)


@pytest.mark.fast
def test_a_python_thread_that_just_ended_is_not_taken_for_a_native_pool() -> None:
    """What `fork_refusal` counts: native threads beyond Python's. Right after `join()` an ended
    thread's task is often still listed in /proc (half the time on this box, read at once) while
    `threading` has let it go; read at that moment it passed for a native pool started, and the
    job's pool spawned its fork server (seconds) for nothing. A native thread that stays (the
    origin's count one lower) is still told."""
    at_origin = _native_threads_beyond_python()
    for _ in range(200):
        thread = threading.Thread(target=lambda: None)
        thread.start()
        thread.join()
        assert not _native_threads_since_origin(at_origin)
    assert _native_threads_since_origin(at_origin - 1)


# `g++` first on the PATH: the real one, except that while the flag file exists a kernel build
# whose source holds the marker constant writes half its library and hangs, a link the sandbox
# kills midway. Inductor's commands name the compiler `g++` either way, so the build keys (and the
# shared cache's vector-ISA probes and precompiled header) are those of every other test.
_STALLING_CXX = """#!/bin/bash
{gxx} "$@" || exit $?
output=""; marked=""
while [ $# -gt 0 ]; do
  case "$1" in
    -o) output="$2"; shift ;;
    *.cpp) grep -q {marker} "$1" && marked=1 ;;
  esac
  shift
done
case "$output" in *.gch) echo "$output" >> "{flag}.headers" ;; esac
if [ -e "{flag}" ] && [ -n "$marked" ] && [ "${{output%.so}}" != "$output" ]; then
  truncate -s 64 "$output"
  touch "{flag}.stalled"
  exec sleep 300
fi
"""


@pytest.mark.inductor
@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_a_child_killed_while_linking_leaves_no_truncated_kernel_in_the_shared_cache(
        preloaded: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start: str) -> None:
    """Inductor builds a kernel straight into its place in the compile cache and loads any file it
    finds there: a child killed mid-link (a timeout, a cancelled candidate) left a truncated library,
    and a repro.py or any process outside the sandbox with that kernel failed with `ImportError: ...
    file too short` (CI saw it in a repro.py; a candidate repairs such an entry, `damaged_cache_files`,
    but only where its failure names it). Builds are now renamed into place whole
    (sandbox/whole_builds.py): the killed build leaves nothing there, and the next child compiles
    the kernel and runs it. Forked from this preloaded process, or spawned, where no warm-up ran
    before the children (the candidate installs it itself, and takes the precompiled headers from
    the compile cache, not from its job's temp dir)."""
    marker = f"{random.randrange(10**6, 10**7)}.5"  # a kernel no earlier run left in the shared cache
    flag = tmp_path / "stall"
    (tmp_path / "bin").mkdir()
    cxx = tmp_path / "bin" / "g++"
    cxx.write_text(_STALLING_CXX.format(gxx=shutil.which("g++"), marker=marker, flag=flag))
    cxx.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    graph = marked_kernel(tmp_path, marker, torch.ops.aten.sin.default)
    caches = compile_cache_dir(tmp_path) / "inductor"
    with SandboxPool(tmp_path / "job", tmp_path / "values.pt", JobSpec(backend="inductor"), parallelism=1,
                     warm=False, start=start, env=ALLOWED) as pool:  # no warm-up: the candidates' compiles are the test
        flag.touch()
        killed = pool.submit(graph_to_wire(graph), timeout_s=300)
        assert wait_until(lambda: flag.with_name("stall.stalled").exists(), 180), killed.result(timeout=1)
        assert pool.cancel(killed)
        flag.unlink()
        # The kernel's library, if any (`partial-<pid>-...`, what the killed link wrote, is never loaded).
        kernels = [source.with_suffix(".so") for source in caches.rglob("*.cpp") if marker in source.read_text()]
        assert kernels, "the kernel's source is not in the shared cache"
        assert not any(kernel.exists() and kernel.stat().st_size <= 64 for kernel in kernels), \
            "a truncated kernel is in the cache"
        outcome = pool.submit(graph_to_wire(graph), timeout_s=300).result(timeout=300)
    assert isinstance(outcome, Passes), outcome
    # Cold children, and yet no precompiled header built in the job's folder (each child's temp
    # dir): they take the compile cache's (`keep_precompiled_headers_with_the_caches`).
    headers = flag.with_name("stall.headers")
    built = headers.read_text().split() if headers.exists() else []
    assert not [header for header in built if Path(header).is_relative_to(tmp_path / "job")], built
    # The next build of the kernel removed what the killed one left.
    assert not [left for kernel in kernels for left in kernel.parent.glob(f"partial-*-{kernel.name}")]


@pytest.mark.inductor
def test_a_truncated_kernel_another_process_left_in_the_shared_cache_is_rebuilt_not_taken_for_the_bug(
        preloaded: None, tmp_path: Path) -> None:
    """The cache is the machine's: a process outside the sandbox (a repro.py, a user's own run under
    the same cache dir) killed mid-link, or a full disk, can still leave a truncated kernel where
    inductor looks, and every candidate needing it would fail with `ImportError: ... file too
    short`, a failure of the machine taken for the program's. The candidate that meets it removes
    that entry (only inside the compile caches, `damaged_cache_files`) and compiles again, once."""
    marker = f"{random.randrange(10**6, 10**7)}.25"  # a kernel no earlier run left in the shared cache
    graph = marked_kernel(tmp_path, marker, torch.ops.aten.cos.default)
    caches = compile_cache_dir(tmp_path) / "inductor"
    with SandboxPool(tmp_path / "job", tmp_path / "values.pt", JobSpec(backend="inductor"), parallelism=1,
                     env=ALLOWED) as pool:
        assert isinstance(pool.submit(graph_to_wire(graph), timeout_s=300).result(timeout=300), Passes)
        kernels = [source.with_suffix(".so") for source in caches.rglob("*.cpp") if marker in source.read_text()]
        assert [kernel for kernel in kernels if kernel.exists()], "the kernel's library is not in the shared cache"
        for kernel in kernels:
            if kernel.exists():
                os.truncate(kernel, 64)
        outcome = pool.submit(graph_to_wire(graph), timeout_s=300).result(timeout=300)
    assert isinstance(outcome, Passes), outcome
    assert all(kernel.stat().st_size > 64 for kernel in kernels if kernel.exists())
