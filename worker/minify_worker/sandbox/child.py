"""What a sandbox child does, in the process the fork server forked for it: leave the server
behind (its own session, death with the server, none of the server's descriptors), confine itself,
run one request (a candidate, or a call into `minify_worker`) and write its result file. A
long-lived child (reuse) sets up its device once and runs candidates one at a time, dropping
dynamo's and inductor's in-memory state between them, until it is told to stop or retires itself."""

from __future__ import annotations

import faulthandler
import gc
import importlib
import json
import os
import re
import selectors
import signal
import sys
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minify_contract.models import JobSpec

from ..outcomes import outcome_to_dict
from .limits import confine_child
from .processes import PR_SET_PDEATHSIG, own_resident_mb, prctl, redirect_output, write_line
from .warmup import warm_up_device

CALL_PREFIX = "minify_worker."
# More module prefixes a call target may have (comma-separated), for the tests' own targets
# (tests/support/calls.py): the product calls into minify_worker only.
ALLOWED_CALLS_ENV = "MINIFY_ALLOWED_CALLS"
# How much a long-lived child's resident memory may grow over its start before it is replaced.
REUSE_MEMORY_GROWTH_MB = 2048


def call_allowed(target: str, environment: Mapping[str, str]) -> bool:
    """Whether `target` ("module:function") may run in a child whose environment is `environment`:
    its module is in minify_worker, or starts with one of the prefixes in `MINIFY_ALLOWED_CALLS`."""
    module, _, name = target.partition(":")
    extra = [prefix.strip() for prefix in environment.get(ALLOWED_CALLS_ENV, "").split(",") if prefix.strip()]
    return bool(name) and any(module.startswith(prefix) for prefix in (CALL_PREFIX, *extra))


@dataclass
class ChildContext:
    """What a `SandboxPool.call` target receives."""

    workdir: Path
    spec: JobSpec
    values: dict[str, Any]


@dataclass
class ChildSetup:
    """What a child takes from the fork server that forks it: the job, the value store as loaded
    then, and the server's descriptors (and selector), which it closes first."""

    root: Path
    workdir: Path
    spec: JobSpec
    threads: int
    values: dict[str, Any]
    reuse: int
    server_pid: int
    server_descriptors: list[int]
    selector: selectors.BaseSelector | None


def enter(setup: ChildSetup, log_path: Path) -> None:
    """What every child does first: its own session and process group, death with the server,
    default signal handlers, none of the server's descriptors, output to its log.

    The objects it inherits (torch's modules, the server's preloaded state) are frozen first: its
    collections, automatic or `_drop_compile_state`'s between a long-lived child's candidates, then
    walk only what the child made. A full collection over the inherited heap took about 0.2 CPU-s
    and wrote to every page of it (each copied from the server's), per candidate."""
    gc.freeze()
    os.setsid()
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != setup.server_pid:
        os._exit(1)
    signal.set_wakeup_fd(-1)
    for number in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGPIPE):
        signal.signal(number, signal.SIG_DFL)
    if setup.selector is not None:
        setup.selector.close()
    for fd in setup.server_descriptors:
        os.close(fd)
    redirect_output(log_path)
    # A child that dies of a signal (a segfault in a compiler, a loader, a kernel launch) writes
    # the Python stack it died in to its log first, which a job that did not reproduce shows its
    # user: the signal alone does not say whether the compile, the load or the run crashed. The
    # handler re-raises the signal, so the child still ends by it. fd 2 stays the log's: a
    # long-lived child's next `redirect_output` points it at the next candidate's.
    faulthandler.enable(file=2, all_threads=False)


def run_child(setup: ChildSetup, request: dict[str, Any], result_path: Path, log_path: Path) -> None:
    """A child forked for one request: enter, confine, run it, write its result to `result_path`."""
    enter(setup, log_path)
    try:
        confine_child(setup.root / "tmp" / str(request["id"]), setup.spec)
        import torch

        torch.set_num_threads(setup.threads)
    except BaseException as error:  # the sandbox cannot run anything here: not a candidate's doing
        _write_result(result_path, {"sandbox_error": f"the sandbox child could not start: "
                                                     f"{type(error).__name__}: {error}",
                                    "traceback": traceback.format_exc()})
        return
    run_to_file(setup, request, result_path)


def run_long_lived_child(setup: ChildSetup, request_r: int, ack_w: int) -> None:
    """A long-lived child: set up the device once, then run candidates one at a time until it
    is told to stop, or retires itself (`_should_retire`)."""
    pid = os.getpid()
    enter(setup, setup.root / "logs" / f"worker-{pid}.log")
    try:
        confine_child(setup.root / "tmp" / f"worker-{pid}", setup.spec)
        import torch

        torch.set_num_threads(setup.threads)
        warm_up_device(setup.spec)
    except BaseException as error:
        write_line(ack_w, {"event": "failed", "error": f"{type(error).__name__}: {error}"})
        return
    write_line(ack_w, {"event": "ready"})
    baseline_mb = own_resident_mb()
    ran = 0
    with os.fdopen(request_r, "rb") as requests:
        for line in requests:
            request = json.loads(line)
            redirect_output(setup.root / "logs" / f"{request['id']}.log")
            result = run_to_file(setup, request, setup.root / "results" / f"{request['id']}.json")
            ran += 1
            retire = ran >= setup.reuse or _should_retire(result, own_resident_mb() - baseline_mb)
            if not retire:
                _drop_compile_state(setup.spec)
            write_line(ack_w, {"event": "done", "id": request["id"], "retire": retire})
            if retire:
                return


def run_to_file(setup: ChildSetup, request: dict[str, Any], result_path: Path) -> dict[str, Any]:
    result_path.with_suffix(".started").touch()
    try:
        result = run_request(setup, request)
    except BaseException as error:
        result = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
    _write_result(result_path, result)
    sys.stdout.flush()
    sys.stderr.flush()
    return result


def run_request(setup: ChildSetup, request: dict[str, Any]) -> dict[str, Any]:
    from ..programs.classify import EnvironmentFault, environment_fault

    if request["kind"] == "candidate":
        from ..programs import of_wire

        try:
            outcome = of_wire(request["graph"]).run_wire_candidate(request["graph"], setup.values, setup.spec,
                                                                   setup.root / "tmp", runs=request.get("runs", 1))
        except EnvironmentFault as fault:
            return {"sandbox_error": str(fault)}
        return {"outcome": outcome_to_dict(outcome)}
    module_name, _, name = request["target"].partition(":")
    try:
        if not call_allowed(request["target"], os.environ):
            raise ValueError(f"call target {request['target']!r} is not in minify_worker (nor {ALLOWED_CALLS_ENV})")
        function = getattr(importlib.import_module(module_name), name)
        value = function(ChildContext(setup.workdir, setup.spec, setup.values), **request["kwargs"])
        json.dumps(value)
    except Exception as error:
        fault = environment_fault(error)
        if fault is not None:
            return {"sandbox_error": fault}
        return {"ok": False, "error_type": type(error).__name__, "error": f"{type(error).__name__}: {error}",
                "traceback": traceback.format_exc()}
    return {"ok": True, "value": value}


def _write_result(result_path: Path, result: dict[str, Any]) -> None:
    temporary = result_path.with_suffix(".tmp")
    temporary.write_text(json.dumps(result))
    os.replace(temporary, result_path)


# Signs that a process cannot be trusted with another candidate: CUDA's context is unusable after
# an error (illegal memory access, device-side assert, ...), and a sandbox error is the process's own.
_UNUSABLE_AFTER = re.compile(r"CUDA error|device-side assert|illegal memory access|CUBLAS_STATUS|"
                             r"CUDNN_STATUS|an illegal instruction|unspecified launch failure")


def _should_retire(result: dict[str, Any], growth_mb: float) -> bool:
    """Whether a long-lived child retires after this result: its process may not be fit to run another."""
    if "sandbox_error" in result or "error" in result or growth_mb > REUSE_MEMORY_GROWTH_MB:
        return True
    outcome = result.get("outcome") or {}
    if outcome.get("kind") in ("crashed", "oom", "timed_out"):
        return True
    text = json.dumps(outcome.get("signature") or {})
    return _UNUSABLE_AFTER.search(text) is not None


def _drop_compile_state(spec: JobSpec) -> None:
    """Between two candidates in one process: forget what dynamo and inductor keep in memory (their
    on-disk caches stay, shared by all children) and give cached device memory back."""
    import torch

    torch._dynamo.reset()
    try:
        from torch._inductor.codecache import PyCodeCache

        PyCodeCache.cache_clear(purge=False)
    except (ImportError, AttributeError, TypeError):
        pass
    gc.collect()
    if spec.device_class == "cuda":
        torch.cuda.empty_cache()
