"""Fixtures shared by the test modules."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# As every worker entry point does (minify_worker/__init__.py), before anything asks about CUDA:
# otherwise one `torch.cuda.is_available()` here makes CUDA unusable in every forked sandbox child.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
# Spawned sandbox servers import test backends by path (tests/support/backends.py): from the repo root.
REPO = Path(__file__).resolve().parent.parent
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
# Every job ends with the culprit phase (programs/fx/culprit/), whose floor is 20 s of compiler bisection: the
# tests that are not about it keep it to a few seconds (a partial culprit, said so); those that
# are (tests/worker/programs/fx/test_culprit.py) give it minutes.
os.environ.setdefault("MINIFY_CULPRIT_MIN_BUDGET_S", "5")
# The suite's xdist workers share the machine's cores (three on CI's two): a job's second child, the
# default on two cores, runs candidates its reduction may never take, on CPU the other workers'
# tests wanted (test_engine_inductor: 159 CPU-s with two children, 118 with one). So every job that
# sets no parallelism of its own runs one child at a time, as a worker that shares its machine is
# told to (`minify-worker --parallelism`, docs/deploy.md); the tests of running candidates side by
# side set `limits.parallelism` themselves, and the services' workers inherit this.
os.environ.setdefault("MINIFY_PARALLELISM", "1")


def _one_compile_cache_for_every_process() -> None:
    """Point inductor (and triton) at the machine's compile cache, the one the engine's sandboxes
    use (`compile_cache_dir`), for every process the suite starts. Processes that compile outside a
    sandbox (the capture suite's pytest run, each repro.py, the capture tests) otherwise use
    torch's default under /tmp and compile again the kernels the jobs beside them compiled: on a
    fresh CI machine every cache starts cold. Entries are keyed by source and config, and failed
    compiles are never cached, so sharing changes no outcome. A cache dir set by hand wins."""
    import tempfile

    from minify_worker.sandbox.warmup import compile_cache_variables

    for name, value in compile_cache_variables(Path(tempfile.gettempdir())).items():
        os.environ.setdefault(name, value)


def _one_precompiled_header_folder_for_every_process() -> None:
    """Inductor keeps its precompiled headers (a build of 10-25 CPU-s each here, one per header and
    set of flags) not in TORCHINDUCTOR_CACHE_DIR but in torch's default cache folder under the temp
    dir (torch/_inductor/codecache.py's `_HEADER_DIR`), and the sandbox's warm-up moves them into
    the compile cache (sandbox/warmup.py): processes outside a sandbox built again each header the
    jobs beside them had built (some 35 CPU-s in a run). Where torch's folder does not exist yet (a
    fresh machine, CI) it is made a link to the compile cache's. A header is keyed by its name, the
    flags, the compiler and its preprocessed source, so sharing changes no outcome."""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:
        return
    torchs = Path(default_cache_dir()) / "precompiled_headers"
    ours = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]) / "precompiled_headers"
    if torchs.exists() or torchs.is_symlink() or torchs == ours:
        return
    ours.mkdir(parents=True, exist_ok=True)
    torchs.parent.mkdir(parents=True, exist_ok=True)
    try:
        torchs.symlink_to(ours, target_is_directory=True)
    except FileExistsError:
        pass  # another xdist worker made it


def _deals_tests_only(config: pytest.Config) -> bool:
    """Whether this process is xdist's controller, which runs no test: it deals them to its workers
    (each an interpreter that loads this file and configures itself), and starts them only once it
    is configured itself."""
    distributed = getattr(config.option, "dist", "no") != "no" and not config.option.collectonly
    return distributed and not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    """The compile caches every process shares, and one intra-op thread in the test process, set
    before any test module runs a torch op: the engine tests below make this process a fork origin
    (`_engine_fork_origin`), which it stays only while no native thread pool has started (OpenMP's
    threads do not survive a fork). Three xdist workers on a 2-core box gain nothing from more;
    sandbox children set their own thread count. Not in xdist's controller: importing torch and
    inductor there (3 s) delayed every worker's start by as much, the run's first seconds on both
    cores spent on a process that runs no test."""
    if _deals_tests_only(config):
        return
    _one_compile_cache_for_every_process()
    _one_precompiled_header_folder_for_every_process()
    import torch

    torch.set_num_threads(1)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The environment every test module was imported with, before any test changed it: repro.py
    runs fork from one interpreter started with it (tests/support/repro.py)."""
    from tests.support import repro

    repro.collected_environment = dict(os.environ)


_preloaded_warm: bool | None = None  # None: not preloaded; else whether with inductor's warm-up
_modules_preloaded_for: set[str] = set()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the first test of a module that runs the engine in this process: `preload()` it, as
    the RQ worker and the offline command preload themselves, so each job's sandbox forks its fork
    server from here instead of spawning one that imports torch and warms up inductor again (seconds
    of CPU per job). The spawned path keeps its own tests (`MINIFY_SANDBOX_START=spawn`,
    `--no-preload`); `fork_refusal` still sends a job to it if this process ever starts a pool.

    Inductor's warm-up (its ISA probe and a compile, ~3 CPU-s) only for a module with tests marked
    `inductor` (real inductor compiles); the others' jobs use test backends, which never read it. A
    fork server whose origin did not warm up warms up itself for an inductor job (`origin_warmed_up`),
    so a module marked otherwise than its jobs compile costs time, never an outcome."""
    global _preloaded_warm
    module = getattr(item, "module", None)
    if _preloaded_warm or module is None or module.__name__ in _modules_preloaded_for or not hasattr(module, "minify"):
        return
    from minify_worker.engine import minify
    from minify_worker.sandbox import preload

    _modules_preloaded_for.add(module.__name__)
    if module.minify is not minify:
        return
    warm = any(other.get_closest_marker("inductor") is not None for other in item.session.items
               if getattr(other, "module", None) is module)
    if _preloaded_warm is None or warm:
        preload(warm=warm)
        _preloaded_warm = warm


@pytest.fixture(autouse=True)
def _torch_configs_restored() -> Iterator[None]:
    """Put back what a test changed in the torch configs a spec can set (`CONFIG_MODULES`), so that
    no later test in the same xdist worker compiles or captures under it: a candidate run in the
    test's own process sets its spec's config globally, as the worker does for a child that ends
    with the candidate (`apply_inductor_config`), and a capture in a later test recorded a dynamo
    setting left that way. Only where torch is imported already: other tests do not pay for it."""
    import importlib
    import sys

    if "torch" not in sys.modules:
        yield
        return
    from minify_contract.config_keys import CONFIG_MODULES

    configs: list[Any] = [importlib.import_module(name) for name in CONFIG_MODULES]
    saved = [config.get_config_copy() for config in configs]
    yield
    for config, before in zip(configs, saved, strict=True):
        for key, value in config.get_config_copy().items():
            if key in before and before[key] != value:
                setattr(config, key, before[key])


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The example programs relu_cos and chain, saved as .pt2 once per test module."""
    from examples.programs import save

    directory = tmp_path_factory.mktemp("programs")
    return {name: save(name, directory) for name in ("relu_cos", "chain")}


@pytest.fixture
def test_backends_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sandbox children may import the test backends (tests/support/backends.py)."""
    from minify_worker.programs.fx.backends import ALLOWED_BACKENDS_ENV
    from tests.support.backends import PREFIX

    monkeypatch.setenv(ALLOWED_BACKENDS_ENV, PREFIX)


# -- the client's tests against a scripted server (test_client_cli.py, test_client_retry.py) ----


@pytest.fixture
def server() -> Iterator[Any]:
    """A `ScriptedServer` (tests/support/scripted_server.py) on a loopback port, for this test."""
    from tests.support.scripted_server import ScriptedServer

    with ScriptedServer() as scripted:
        yield scripted


@pytest.fixture
def program(tmp_path: Path) -> Path:
    """A file the client uploads as it is: the scripted server never loads it."""
    path = tmp_path / "relu_cos.pt2"
    path.write_bytes(b"PK-not-really-a-program")
    return path


# -- scheduling on xdist workers (`make test` runs `-n 3 --dist loadgroup`) ----------------------

# Modules whose module-scoped fixtures start something costly: a pytest session that captures and
# minimizes (test_capture_plugin), a service with workers, a browser, a sandbox pool (a spawned fork
# server imports torch), captures minimized once for the module's tests (the fidelity families), compiled
# programs. Tests are otherwise dealt out one at a time (xdist gives each worker the next test as it
# frees up, so a module's neighbouring tests land on all three), and such a fixture ran once on *each*
# worker that got one of them (the capture suite's 100 s twice); grouped, a module's tests go to one
# worker and its fixtures run once. Modules whose module fixtures are cheap (a saved program) stay spread.
# (The services and browser whose tests mostly wait are in WAITING_MODULES below: one worker too.)
ONE_WORKER_MODULES = frozenset({
    "test_capture_plugin", "test_culprit", "test_api", "test_api_docs",
    "test_dynamic_shapes", "test_client_e2e", "test_shrink", "test_offline_out", "test_dashboard_bugs",
    # services (a server, its Redis, workers that import torch)
    "test_api_auth", "test_api_program_json",
    # browsers
    "test_dashboard_static", "test_dashboard_bugreport",
    # captures and jobs run once for the module's tests
    "test_fidelity_constants", "test_fidelity_mutation", "test_fidelity_factories", "test_capture_dynamic",
    "test_custom_ops", "test_gpu_safety",
    "test_crash_eager_raises",
    "test_control_flow",  # one repro.py server (tests/support/repro_forks.py) for its five repros
    # sandbox pools and their fork servers, a Redis, the torch config's description
    "test_sandbox", "test_sandbox_reuse", "test_run", "test_environment", "test_faults_fencing",
    "test_versions_faults",  # a Redis, and jobs run in this process (the engine preloaded for them)
})


# Tests marked `waits` spend their time waiting out bounds (a hang held to its timeout, an original
# slow on purpose), not computing. Dealt out like the rest, they came last in the collection's order
# (tests/worker/engine/), ran on all three workers at once, and left the two cores half idle for the
# run's last minute or two (measured: 91% busy over a run, 54% over its last 90 s). As one group they
# run one after another on one worker (xdist sends the larger groups first), their waits beside the
# other two workers' compiles.
WAITING_GROUP = "waits"
# Whole modules whose tests wait too, on processes of their own rather than on CPU: a service's
# RQ worker and the server's polls (a job's originals slow on purpose, Redis stopped or hung on
# purpose), a browser waiting for a page's live updates, a Redis answering. Measured at 0881253 (a
# module's CPU over its wall time, its fixtures' processes included): test_outages 1 of 10.5 s,
# test_culprit_after_result 11 of 28-33, test_faults_service 12 of 24-28, test_dashboard 28-31 of
# 60-63, test_ledger and test_config_schema ~0 of 8-9 each, where a compile-bound test on a worker
# shared three ways takes 0.65-0.9 of its wall. Dealt to the compiling workers they left a core
# idle whenever the waiting worker waited too; in the waiting group, on one worker with their module
# fixtures run once (each module's tests together, in order), the two others keep both cores busy: a clean
# clone's pytest 617.6 s (1,067 CPU-s in the tests), against 657.7-714 s (1,141-1,200) before.
# The two service modules whose tests wait on their services' jobs and sweeps half the time
# (test_service 38 of 64 s, test_bugs 45 of 68) join too: the group then takes some 550 s of a
# 600 s run, its tests beside the compiles.
WAITING_MODULES = frozenset({
    "test_outages", "test_culprit_after_result", "test_faults_service", "test_dashboard", "test_ledger",
    "test_config_schema", "test_service", "test_bugs",
})


def pytest_itemcollected(item: pytest.Item) -> None:
    # At collection, before any pytest_collection_modifyitems: xdist's turns the mark into a group.
    if item.get_closest_marker("xdist_group") is not None:
        return
    module = item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
    if module in WAITING_MODULES:
        item.add_marker(pytest.mark.xdist_group(WAITING_GROUP))
    elif module in ONE_WORKER_MODULES:
        item.add_marker(pytest.mark.xdist_group(module))
    elif item.get_closest_marker("waits") is not None:
        item.add_marker(pytest.mark.xdist_group(WAITING_GROUP))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """`MINIFY_TEST_CPU=FILE`: each test's CPU seconds (this process and every child it waited for,
    setup and teardown included: a module fixture's processes count to the test that started or
    stopped them), its worker and its start (epoch seconds, for a timeline beside a CPU sampler)
    appended to FILE as JSON lines, for finding where the suite's time goes (the suite is CPU-bound
    on two cores; `scripts/test_cpu.py FILE` sums it by module)."""
    out = os.environ.get("MINIFY_TEST_CPU")
    if not out:
        yield
        return
    import json
    import resource
    import time

    def cpu() -> tuple[float, float]:
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime

    (own_before, children_before), started, started_at = cpu(), time.monotonic(), time.time()
    yield
    own_after, children_after = cpu()
    with open(out, "a") as lines:
        lines.write(json.dumps({"test": item.nodeid, "own_s": round(own_after - own_before, 2),
                                "children_s": round(children_after - children_before, 2),
                                "wall_s": round(time.monotonic() - started, 2),
                                "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
                                "start": round(started_at, 2)}) + "\n")
