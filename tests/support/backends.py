"""Test backends: cheap torch.compile-style backends (`fn(gm, example_inputs) -> callable`, no
compiler) that fail, crash, hang or go wrong on a chosen op, for the tests and the bench's zoo.

Sandbox children import them by path, e.g. `"tests.support.backends:fail_on_relu"`, when the
prefix `tests.support.backends` is in `MINIFY_ALLOWED_BACKENDS` (the `test_backends_allowed`
fixture sets it) and the repo root is on PYTHONPATH (tests/conftest.py and bench/run.py put it there).

The factories (`raise_on`, `signal_on`, `hang_on` ...) return a backend that behaves like eager
unless the graph contains the chosen op (matched by its packet name: "relu" matches
`aten.relu.default`), and then fails the chosen way; ready-made instances follow them. The
backends after those are for the sandbox's own faults and the engine's guards.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from minify_worker.programs.fx.backends import ALLOWED_BACKENDS_ENV

PREFIX = "tests.support.backends"
# What a process that starts sandbox children needs in its environment for them to import these (a
# test of the engine in this process takes the `test_backends_allowed` fixture instead).
ALLOWED = {ALLOWED_BACKENDS_ENV: PREFIX}

Backend = Callable[[fx.GraphModule, list[Any]], Callable[..., Any]]


def op_name(target: Any) -> str:
    """"relu" for `aten.relu.default`, the function name for anything else."""
    packet = getattr(target, "overloadpacket", None)
    if packet is not None:
        return packet.__name__
    return getattr(target, "__name__", str(target))


def has_op(gm: fx.GraphModule, op: str) -> bool:
    return any(node.op == "call_function" and op_name(node.target) == op for node in gm.graph.nodes)


def _eager(gm: fx.GraphModule) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        return gm(*args)

    return run


def raise_on(op: str, error: type[Exception] = RuntimeError, message: str | None = None,
             *, at: str = "compile") -> Backend:
    """Raise `error(message)` when the graph has `op`: while compiling, or (`at="run"`) when run."""
    text = message or f"injected failure on {op}"

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        if not has_op(gm, op):
            return _eager(gm)
        if at == "compile":
            raise error(text)

        def run(*args: Any) -> Any:
            raise error(text)

        return run

    return backend


def raise_on_all(*ops: str, error: type[Exception] = RuntimeError) -> Backend:
    """Raise while compiling a graph that has every op of `ops` (a bug that needs them together:
    any one of them alone compiles)."""
    text = f"injected failure on {' and '.join(ops)} together"

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        if all(has_op(gm, op) for op in ops):
            raise error(text)
        return _eager(gm)

    return backend


def signal_on(op: str, signum: int = signal.SIGSEGV) -> Backend:
    """Kill the compiling process with `signum` (a segfault by default) when the graph has `op`."""

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        if has_op(gm, op):
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            time.sleep(60)
        return _eager(gm)

    return backend


def hang_on(op: str, *, with_grandchild: bool = False) -> Backend:
    """Sleep forever while compiling a graph that has `op` (optionally with a `sleep` child, like a stuck
    compiler subprocess, to check that the whole process group dies)."""

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        if has_op(gm, op):
            if with_grandchild:
                subprocess.Popen(["sleep", "3600"])
            while True:
                time.sleep(3600)
        return _eager(gm)

    return backend


def exit_on(op: str, code: int = 3) -> Backend:
    """Exit the process with `code`, bypassing Python's cleanup, when the graph has `op`."""

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        if has_op(gm, op):
            os._exit(code)
        return _eager(gm)

    return backend


def wrong_on(op: str, delta: float = 1.0) -> Backend:
    """Run eagerly but add `delta` to every floating-point result of `op` (an accuracy bug)."""

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        class Wrong(fx.Interpreter):
            def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
                result = super().call_function(target, args, kwargs)
                if op_name(target) == op and isinstance(result, torch.Tensor) and result.is_floating_point():
                    return result + delta
                return result

        def run(*args: Any) -> Any:
            return Wrong(gm).run(*args)

        return run

    return backend


def in_fp64(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """The graph computed in float64, its floating-point outputs cast back to float32 (bit-exact
    where eager's rounding does not matter, otherwise fp64's rounding: the accuracy rule passes it)."""
    def run(*args: Any) -> Any:
        outputs = gm(*[value.double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value
                       for value in args])
        return tuple(value.float() if isinstance(value, torch.Tensor) and value.is_floating_point() else value
                     for value in outputs)

    return run


# The ops whose output size the values decide (`torch.unique` is `_unique2` in an aten graph).
_VALUE_SIZED_OPS = ("unique_consecutive", "unique", "_unique2", "unique_dim", "masked_select")


def drop_last_float_output(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Run eagerly; where the graph has an op whose output size the values decide, the last value of
    each one-dimensional floating-point output dropped (a wrong size)."""
    if not any(has_op(gm, op) for op in _VALUE_SIZED_OPS):
        return _eager(gm)

    def run(*args: Any) -> Any:
        return tuple(value[:-1] if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() == 1
                     else value for value in gm(*args))

    return run


def oom_on(op: str) -> Backend:
    """Raise the error an allocator raises when it runs out of memory, when the graph has `op`."""
    return raise_on(op, torch.OutOfMemoryError, "CUDA out of memory. Tried to allocate 2.00 GiB", at="run")


def kill_sandbox_on(op: str) -> Backend:
    """SIGKILL the process that forked this one (the sandbox's fork server) when the graph has `op`."""

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        if has_op(gm, op):
            os.kill(os.getppid(), signal.SIGKILL)
            time.sleep(60)
        return _eager(gm)

    return backend


def first_match(*rules: tuple[str, Backend]) -> Backend:
    """The backend of the first rule whose op the graph has; eager when none matches."""

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        for op, inner in rules:
            if has_op(gm, op):
                return inner(gm, example_inputs)
        return _eager(gm)

    return backend


fail_on_relu = raise_on("relu")
fail_on_relu_at_runtime = raise_on("relu", at="run")
fail_on_cos = raise_on("cos", ValueError, "injected failure on cos")
segfault_on_relu = signal_on("relu", signal.SIGSEGV)
abort_on_relu = signal_on("relu", signal.SIGABRT)
hang_on_relu = hang_on("relu")
hang_with_grandchild_on_relu = hang_on("relu", with_grandchild=True)
exit_on_relu = exit_on("relu")
wrong_on_relu = wrong_on("relu")
oom_on_relu = oom_on("relu")
fail_on_sin_and_relu = raise_on_all("sin", "relu")
def null_read_on(op: str) -> Backend:
    """Read address 0 when the graph has `op`: a real segfault, the way a native compiler or loader
    dies (no handler reset first, unlike `signal_on`)."""

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        if has_op(gm, op):
            import ctypes

            ctypes.string_at(0)
        return _eager(gm)

    return backend


def crash_on_every_graph(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """A real segfault on every graph, the empty one included: as torch 2.11+cu130 died loading
    every AOTInductor CUDA package on an H200, whatever the program."""
    import ctypes

    ctypes.string_at(0)
    return _eager(gm)


kill_sandbox_on_relu = kill_sandbox_on("relu")
fail_on_relu_hang_on_sin = first_match(("relu", fail_on_relu), ("sin", hang_on("sin")))
fail_on_relu_other_error_on_cos = first_match(("relu", fail_on_relu), ("cos", fail_on_cos))


def say_then_fail_on_cos(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Prints a line on stderr as it compiles, as a compiler's warnings do, then is `fail_on_cos`:
    a program without cos passes, and what it printed is the original's output."""
    print(f"say_then_fail_on_cos: compiling {len(gm.graph.nodes)} nodes", file=sys.stderr, flush=True)
    return fail_on_cos(gm, example_inputs)


fail_on_relu_kill_sandbox_on_sin = first_match(("relu", fail_on_relu), ("sin", kill_sandbox_on("sin")))
# The bench's zoo (bench/zoo.py): two ops far apart in a model, and a wrong softmax.
fail_on_max_pool_and_mean = raise_on_all("max_pool2d_with_indices", "mean")
fail_on_gelu_and_layer_norm = raise_on_all("gelu", "native_layer_norm")
wrong_on_softmax = wrong_on("_softmax")
# tests/worker/programs/fx/test_shrink_runs_eagerly.py: x[randperm(n)], as pytorch#183988
fail_on_index = raise_on("index")

# One backend that misbehaves a different way per op, so one warm pool can show every outcome.
misbehave_by_op = first_match(
    ("relu", raise_on("relu")),
    ("neg", raise_on("neg", at="run")),
    ("cos", raise_on("cos", ValueError, "injected failure on cos")),
    ("sin", signal_on("sin", signal.SIGSEGV)),
    ("tanh", hang_on("tanh", with_grandchild=True)),
    ("exp", exit_on("exp")),
    ("sigmoid", oom_on("sigmoid")),
    ("abs", wrong_on("abs")),
    ("cosh", null_read_on("cosh")),
)

CUDA_FORK_ERROR = ("Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, "
                   "you must use the 'spawn' start method")

# Set in a process that then forks its sandbox: its forked children see it, spawned ones do not,
# the way a process that initialized CUDA poisons its forks and only its forks.
POISONED = False


def fail_always(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Fails on every graph, the empty one included: the failure does not depend on the program."""
    raise RuntimeError("injected failure on every graph")


def cuda_fork_error_when_poisoned(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """What CUDA says in a child forked from a process that initialized it; else fails on relu."""
    if POISONED:
        raise RuntimeError(CUDA_FORK_ERROR)
    if has_op(gm, "relu"):
        raise RuntimeError("injected failure on relu")
    return _eager(gm)


def cuda_fork_error_always(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """A device this sandbox can never use: every candidate, every sandbox."""
    raise RuntimeError(CUDA_FORK_ERROR)


def failed_import_on_relu(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Inductor's way of failing on broken generated code: InductorError around the code cache's
    RuntimeError("Failed to import <path>\\nSyntaxError: ..."), whose cause was dropped."""
    if not has_op(gm, "relu"):
        return _eager(gm)
    from torch._inductor.exc import InductorError

    inner = RuntimeError("Failed to import /tmp/torchinductor_x/ab/cabq2z3kqw7wf4xq7qg3u5ohp4o.py\n"
                         "SyntaxError: invalid syntax (cabq2z3kqw7wf4xq7qg3u5ohp4o.py, line 12)")
    raise InductorError(inner, None)


def allocate_on_relu(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """A compiler that eats all memory on relu: allocates (and touches) 64 MiB chunks without bound."""
    if has_op(gm, "relu"):
        hoard = []
        while True:
            hoard.append(bytearray(b"\x01") * (64 << 20))
    return _eager(gm)


# Set in a child once it compiled a graph with sigmoid: state one candidate leaves behind for the
# next one in the same process.
_SAW_SIGMOID = False


def relu_fails_after_sigmoid(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Fails on relu once this process has compiled a sigmoid: in a fresh process, only a graph with
    both fails; in a reused one, relu alone fails after any sigmoid candidate."""
    global _SAW_SIGMOID
    if has_op(gm, "sigmoid"):
        _SAW_SIGMOID = True
    if has_op(gm, "relu") and _SAW_SIGMOID:
        raise RuntimeError("injected failure on relu after a sigmoid")
    return _eager(gm)


def device_assert_on_relu(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """A kernel that trips a CUDA device-side assert when the graph has relu (an out-of-range
    index, raised at the next synchronization): the context is unusable afterwards."""
    if not has_op(gm, "relu"):
        return _eager(gm)

    def run(*args: Any) -> Any:
        values = torch.ones(4, device=args[0].device)
        values[torch.tensor([1 << 20], device=args[0].device)] += 1
        torch.cuda.synchronize(args[0].device)
        return gm(*args)

    return run


def _has_symbolic_sizes(gm: fx.GraphModule, example_inputs: list[Any]) -> bool:
    """Whether a placeholder's example value (dynamo's `example_value`, or `val`) or an example input
    has a SymInt size, or is a SymInt: what a dynamic compile gives a backend."""
    values = [node.meta.get(key) for node in gm.graph.nodes if node.op == "placeholder"
              for key in ("example_value", "val")]
    for value in [*values, *example_inputs]:
        if isinstance(value, torch.SymInt):
            return True
        if isinstance(value, torch.Tensor) and any(isinstance(size, torch.SymInt) for size in value.shape):
            return True
    return False


def fail_on_symbolic_relu(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Fails on relu only when compiled with symbolic sizes (torch.compile(dynamic=True) fails, the
    default passes); else eager."""
    if has_op(gm, "relu") and _has_symbolic_sizes(gm, example_inputs):
        raise RuntimeError("injected failure on relu with symbolic sizes")
    return _eager(gm)


def _subgraph_modules(gm: fx.GraphModule) -> list[fx.GraphModule]:
    """The GraphModules a higher-order op of `gm` calls (cond's branches, a loop's body ...), nested too."""
    return [module for module in gm.modules() if isinstance(module, fx.GraphModule) and module is not gm]


def fail_on_relu_anywhere(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Fails when relu is in the graph or in any of its subgraphs; else eager."""
    if any(has_op(module, "relu") for module in [gm, *_subgraph_modules(gm)]):
        raise RuntimeError("injected failure on relu")
    return _eager(gm)


def fail_on_relu_in_subgraph(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Fails only when relu is inside a subgraph: a failure that needs the control flow."""
    if any(has_op(module, "relu") for module in _subgraph_modules(gm)):
        raise RuntimeError("injected failure on relu in a subgraph")
    return _eager(gm)


_relu_runs_in_this_process = 0


def fail_first_run_on_relu(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """A flaky runtime failure: compiles fine; the first run of a graph with relu in a process
    raises, later runs in that process pass (the original, compiled once and run 3 times, fails 1)."""
    if not has_op(gm, "relu"):
        return _eager(gm)
    run = _eager(gm)

    def flaky(*args: Any) -> Any:
        global _relu_runs_in_this_process
        _relu_runs_in_this_process += 1
        if _relu_runs_in_this_process == 1:
            raise RuntimeError("injected failure on relu")
        return run(*args)

    return flaky



# -- Judging candidates while the original runs (tests/worker/engine/test_engine_speculation.py) -------------

# How long the whole program (sin, relu and cos together) takes in the backends below, while its
# parts take no time (or 2 s): the jobs on its three ops deliver from a candidate in about 1 s, also
# with the 2-core box loaded (3.7), so the original still runs when they do. (It was 8 s.)
WHOLE_PROGRAM_S = 5.0


def fail_on_relu_slowly_when_whole(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Fails on relu; the whole program (sin, relu and cos together) takes `WHOLE_PROGRAM_S` to
    fail, so candidates finish while the original still runs."""
    if has_op(gm, "relu"):
        if has_op(gm, "sin") and has_op(gm, "cos"):
            time.sleep(WHOLE_PROGRAM_S)
        raise RuntimeError("injected failure on relu")
    return _eager(gm)


def fail_on_relu_slowly_or_at_once_on_cos(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Fails on relu, after `WHOLE_PROGRAM_S` for the whole program (sin, relu and cos) and 2 s for a part; a
    graph with cos and no relu fails at once, with another error: the first failing candidate
    does not fail the way the original does."""
    if has_op(gm, "relu"):
        time.sleep(WHOLE_PROGRAM_S if has_op(gm, "sin") and has_op(gm, "cos") else 2)
        raise RuntimeError("injected failure on relu")
    if has_op(gm, "cos"):
        raise ValueError("injected failure on cos")
    return _eager(gm)



# -- Deliver first, confirm after (tests/worker/engine/test_deliver_first.py) -----------------------------------


def _whole(gm: fx.GraphModule) -> bool:
    return has_op(gm, "relu") and has_op(gm, "sin") and has_op(gm, "cos")


def wrong_on_relu_slowly_when_whole(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """An accuracy bug on relu (`wrong_on_relu`); the whole program (sin, relu and cos together)
    takes `WHOLE_PROGRAM_S` to compile, so candidates show the failure while the original still runs."""
    if _whole(gm):
        time.sleep(WHOLE_PROGRAM_S)
    return wrong_on_relu(gm, example_inputs)


def fail_on_relu_unless_whole(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Fails compiling a graph with relu, but the whole program (sin, relu and cos together) takes
    `WHOLE_PROGRAM_S` and then compiles: the original does not do what its parts do."""
    if _whole(gm):
        time.sleep(WHOLE_PROGRAM_S)
        return _eager(gm)
    if has_op(gm, "relu"):
        raise RuntimeError("injected failure on relu")
    return _eager(gm)


def slow_on_relu(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Takes 4 s to compile a graph with relu, then runs it as eager: slow, but no hang, so a
    hang guessed from a shorter timeout must not stand (tests/worker/engine/test_engine_limits.py)."""
    if has_op(gm, "relu"):
        time.sleep(4)
    return _eager(gm)


def slow_on_relu_alone_hang_with_tanh(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Never ends compiling a graph with relu and tanh; takes 2 s to compile relu alone (a graph of
    that one op), and no time for anything else: the smallest program past a short timeout (relu
    alone) is slow, not hung, and must not stand as the hang, while every other passing run is fast,
    so the candidates' calibrated timeout stays short (tests/worker/engine/test_hang_bound.py)."""
    if has_op(gm, "relu"):
        while has_op(gm, "tanh"):
            time.sleep(3600)
        if sum(node.op == "call_function" for node in gm.graph.nodes) == 1:
            time.sleep(2)
    return _eager(gm)


def slow_on_relu_slowest_when_whole(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """As `slow_on_relu`, but the whole program (sin, relu and cos together) takes 20 s: the
    reduction ends on a guessed hang while the original still runs, and the result, given a
    longer timeout, passes (about 8 s in on a quiet box: the original outlasts it by the 12 s it
    did when every time here was longer)."""
    if has_op(gm, "relu"):
        time.sleep(20 if has_op(gm, "sin") and has_op(gm, "cos") else 4)
    return _eager(gm)


# -- Size-dependent failures, for the shrink phase (tests/worker/programs/fx/test_shrink.py) -----------------------


def fail_on_relu_with_a_dim_of_64_or_more(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """A size-dependent bug: compiling a graph with relu fails while some input has a dim of 64 or
    more; smaller inputs compile (eager)."""
    large = any(isinstance(value, torch.Tensor) and any(size >= 64 for size in value.shape)
                for value in example_inputs)
    if has_op(gm, "relu") and large:
        raise RuntimeError("injected failure on relu with a dim of 64 or more")
    return _eager(gm)


def fail_after_running_view_and_relu(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Fails at run time on a graph with both view and relu, after running it eagerly: a view to a
    literal size its (shrunk) input no longer has raises its own error first."""
    if not (has_op(gm, "view") and has_op(gm, "relu")):
        return _eager(gm)

    def run(*args: Any) -> Any:
        gm(*args)
        raise RuntimeError("injected failure on view and relu")

    return run


# The bench's zoo, real models (bench/zoo.py): MobileNetV3's hardswish and pooling, GPT-2's
# written-out gelu and its layer norms.
fail_on_clamp_and_mean = raise_on_all("clamp", "mean")
fail_on_tanh_and_layer_norm = raise_on_all("tanh", "native_layer_norm")


# -- Bugs (tests/server/test_bugs.py, bench/bugs.py): five ops, five bugs --------------------------------

FIVE_BUG_OPS = ("relu", "sigmoid", "tanh", "exp", "neg")
# Fails compiling a graph with any of the five ops, naming it: each op is a bug of its own.
fail_on_each_of_five = first_match(*((op, raise_on(op)) for op in FIVE_BUG_OPS))


# -- Settings that avoid a bug, for the culprit phase's workarounds (tests/worker/programs/fx/test_culprit.py) -------


def fail_on_relu_unless_pattern_matcher_off(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Fails compiling a graph with relu while inductor's `pattern_matcher` is on (its default): a
    bug that flipping one setting avoids. With inductor's `freezing` on, the compiling process dies
    by SIGSEGV instead: a probe that crashes."""
    import torch._inductor.config as inductor_config

    if has_op(gm, "relu"):
        if inductor_config.freezing:
            signal.signal(signal.SIGSEGV, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGSEGV)
            time.sleep(60)
        if inductor_config.pattern_matcher:
            raise RuntimeError("injected failure on relu while the pattern matcher is on")
    return _eager(gm)


def _slow_culprit_screen(seconds: float) -> Backend:
    """Fails compiling a graph with relu, and takes `seconds` first while inductor's
    `pattern_matcher` is off: the reduction never turns it off, the culprit phase's screen of that
    setting does, so the job's result comes fast and its culprit phase is slow."""

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        import torch._inductor.config as inductor_config

        if has_op(gm, "relu"):
            if not inductor_config.pattern_matcher:
                time.sleep(seconds)
            raise RuntimeError("injected failure on relu")
        return _eager(gm)

    return backend


fail_on_relu_slow_culprit = _slow_culprit_screen(4.0)
fail_on_relu_slower_culprit = _slow_culprit_screen(120.0)


# -- Integer results, data-dependent sizes, shared size symbols (issue 38) -----------------------


def wrong_integers_on(op: str) -> Backend:
    """Run eagerly but add one to every integer result of `op` and negate every boolean one (an
    integer accuracy bug: floating-point results are left exact)."""

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        class Wrong(fx.Interpreter):
            def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
                result = super().call_function(target, args, kwargs)
                if op_name(target) != op or not isinstance(result, torch.Tensor):
                    return result
                if result.dtype == torch.bool:
                    return ~result
                return result if result.is_floating_point() or result.is_complex() else result + 1

        def run(*args: Any) -> Any:
            return Wrong(gm).run(*args)

        return run

    return backend


def _after_aot(inner: Backend) -> Backend:
    """`inner` as the forward compiler of AOT autograd, as aot_eager and inductor receive graphs:
    aten ops traced under fake tensors (which need dynamo's ShapeEnv for data-dependent sizes). A
    function, not AOT's backend object, so that a capture names it by its import path."""

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        from torch._dynamo.backends.common import aot_autograd

        return aot_autograd(fw_compiler=inner)(gm, example_inputs)

    return backend


wrong_integers_on_bitwise_xor = wrong_integers_on("bitwise_xor")
wrong_integers_on_xor_after_aot = _after_aot(wrong_integers_on("bitwise_xor"))
fail_on_relu_after_aot = _after_aot(raise_on("relu"))


def _symbolic_dims_of(gm: fx.GraphModule, example_inputs: list[Any]) -> list[Any]:
    values = [node.meta.get("example_value", node.meta.get("val")) for node in gm.graph.nodes
              if node.op == "placeholder"]
    values = [value if value is not None else given for value, given in zip(values, example_inputs, strict=False)]
    return [size.node.expr for value in values if isinstance(value, torch.Tensor)
            for size in value.shape if isinstance(size, torch.SymInt) and size.node.expr.free_symbols]


def fail_naming_symbol_sharing(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Fails compiling a graph with relu whose inputs have symbolic sizes, saying whether two dims
    share one symbol or each has its own: a failure that depends on how symbols are shared (as
    `torch.compile(dynamic=True)` shares a symbol between equal dims and `mark_dynamic` does not)."""
    dims = _symbolic_dims_of(gm, example_inputs)
    if not has_op(gm, "relu") or not dims:
        return _eager(gm)
    if len(set(dims)) < len(dims):
        raise RuntimeError("injected failure on relu: two input dims share one size symbol")
    raise RuntimeError("injected failure on relu: each input dim has a size symbol of its own")


def other_ties(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Runs eagerly, but breaks ties the other way: `argmax`/`argmin` and `max`/`min` along a dim
    pick the last of equal values, `sort` (stable) and `topk` order equal values last to first. Right results, other
    indices than eager's wherever values tie."""

    def reversed_ties(function: Callable[..., Any], x: torch.Tensor, dim: int, *args: Any) -> Any:
        flipped = function(x.flip(dim), dim, *args)
        last = x.shape[dim] - 1
        if isinstance(flipped, torch.Tensor):
            return last - flipped
        return type(flipped)((flipped[0], last - flipped[1]))

    def other_tie(name: str, args: Any, kwargs: Any) -> Any:
        x, *rest = args
        dim = kwargs.get("dim", rest[0] if name in ("argmax", "argmin", "max", "min", "sort") and rest else None)
        if name in ("argmax", "argmin", "max", "min") and isinstance(dim, int):
            return reversed_ties(getattr(torch, name), x, dim % x.dim(), *rest[1:])
        if name == "sort":
            dim = -1 if dim is None else dim
            return reversed_ties(lambda t, d: torch.sort(t, dim=d, stable=True), x, dim % x.dim())
        if name == "topk":
            k, dim = rest[0], (rest[1] if len(rest) > 1 else kwargs.get("dim", -1)) % x.dim()
            return reversed_ties(lambda t, d: torch.topk(t, k, dim=d), x, dim)
        return None

    class OtherTies(fx.Interpreter):
        def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
            result = other_tie(op_name(target), args, kwargs) if args else None
            return result if result is not None else super().call_function(target, args, kwargs)

        def call_method(self, target: Any, args: Any, kwargs: Any) -> Any:
            result = other_tie(str(target), args, kwargs)
            return result if result is not None else super().call_method(target, args, kwargs)

    def run(*args: Any) -> Any:
        return OtherTies(gm).run(*args)

    return run
