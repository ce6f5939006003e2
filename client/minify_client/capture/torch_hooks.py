"""Where a capture taps torch: the three calls that hand a graph to a compiler (the one adapter).

- dynamo hands each graph it captured (one per graph break) to the `torch.compile` backend in
  `OutputGraph.call_user_compiler(gm, example_inputs)`, with the real inputs of the frame;
- inductor's `compile_fx_inner` hands it the graph AOT autograd produced (forward, inference or
  backward, `is_backward=`) through `torch._inductor.compile_fx.wrap_compiler_debug`, torch's own
  after_aot hook, with fake inputs; a backward graph is compiled there at the first
  `loss.backward()`, outside any dynamo call;
- `aoti_compile_and_package(ep)` runs through `torch._inductor.debug.aot_inductor_minifier_wrapper`.

Each is looked up by attribute at call time, so patching it here (inductor's as torch imports them:
`install`) catches every call, however the user imported `torch.compile` or `aoti_compile_and_package`.
Checked on torch 2.13.0. The patches are installed once (`install()`) and pass straight through
while no `Listener` is registered; while one is, a failing call is reported to it as a
`FailedCompile` and its exception re-raised as it was. The graph a compiler receives is copied first
(its node list; metadata and weights are shared), as torch's own repro hooks do, since compilers
rewrite it in place.

What dynamo's backend returns is handed back behind a wrapper (`_watch_runs`): a run that raises
is reported once per graph as a `runtime_error` (unless eager raises on the same inputs too), and,
with the accuracy check on, the first run of a training graph has its gradients judged
(`_check_gradients`) and its inputs' versions watched until the backward (`_watch_versions`).
"""

from __future__ import annotations

import copy
import functools
import importlib
import importlib.abc
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from minify_contract.accuracy import clone_input

from . import crash
from .dynamic import symbolic_values

logger = logging.getLogger(__name__)

Level = Literal["dynamo", "aot"]
ACCURACY_ENV = "MINIFY_CAPTURE_ACCURACY"
# Why the accuracy or gradient check could not judge a graph in this process ("Type: first line",
# each once): a wrong value there goes uncaptured, which the diagnosis must not call "no graph wrong".
skipped_checks: list[str] = []
_RECORDED = "_minify_capture_recorded"  # set on an exception once a hook reported it


@dataclass
class FailedCompile:
    """One failing compiler call: where (`level`), the graph and the inputs it was handed (or the
    ExportedProgram, for AOTI), the backend's name, the settings in effect and the error."""

    level: Literal["dynamo", "aot", "aoti"]
    error: BaseException
    backend: str
    config: dict[str, Any]
    graph: Any = None  # torch.fx.GraphModule
    inputs: list[Any] = field(default_factory=list)
    program: Any = None  # torch.export.ExportedProgram (level "aoti")
    is_backward: bool = False
    kind: Literal["compile_error", "runtime_error", "accuracy"] = "compile_error"
    # What each placeholder was compiled with (fake values, SymInt sizes), for a dynamic export.
    symbolic: list[Any] = field(default_factory=list)
    # The grad mode of the compile: a graph of torch.func transforms is lowered in it (`transforms`).
    grad_enabled: bool = True
    # Compiled for training (grad mode on, an input requiring grad: AOT autograd traced the joint
    # graph and compiled its backward too), where that is known before the compile (a hang's capture).
    for_training: bool = False
    # The autocast region the compiled function was called in ({"device", "dtype"}), or None: dynamo
    # keeps it out of the graph (a guard), so the job spec carries it (`JobSpec.autocast`).
    autocast: dict[str, str] | None = field(default_factory=lambda: ambient_autocast())


def ambient_autocast() -> dict[str, str] | None:
    """The autocast region this thread is in ({"device", "dtype"}), or None (or torch not loaded)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    for device in ("cuda", "cpu"):
        if torch.is_autocast_enabled(device):
            return {"device": device, "dtype": str(torch.get_autocast_dtype(device)).removeprefix("torch.")}
    return None


class Listener(Protocol):
    level: Level
    accuracy: bool

    def on_failure(self, failed: FailedCompile) -> None: ...


_listeners: list[Listener] = []
_lock = threading.Lock()
_installed = False
_inside = threading.local()  # .aoti: an aoti_compile_and_package call is running on this thread


def add_listener(listener: Listener) -> None:
    install()
    with _lock:
        _listeners.append(listener)


def remove_listener(listener: Listener) -> None:
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)


def install() -> None:
    """Patch the three compiler entry points (idempotent; imports dynamo, not inductor).

    Inductor's two (`torch._inductor.compile_fx`, `torch._inductor.debug`) are patched as torch
    imports them, when a graph first reaches inductor or AOTInductor (`_PatchOnImport`), or at once
    where they are imported already: importing them here cost every captured process that never
    uses inductor about 4 CPU-s (the code generators, jinja2, pygments), about half of what a
    process that compiles one small graph with another backend spends."""
    global _installed
    with _lock:
        if _installed:
            return
        from torch._dynamo.output_graph import OutputGraph

        OutputGraph.call_user_compiler = _dynamo_hook(OutputGraph.call_user_compiler)
        waiting: dict[str, Callable[[Any], None]] = {}
        for name, patch in _INDUCTOR_PATCHES.items():
            if name in sys.modules:
                patch(sys.modules[name])
            else:
                waiting[name] = patch
        if waiting:
            sys.meta_path.insert(0, _PatchOnImport(waiting))
        _installed = True


def _patch_compile_fx(module: Any) -> None:
    # compile_fx calls wrap_compiler_debug through its module global, looked up at each compile.
    module.wrap_compiler_debug = _aot_hook(module.wrap_compiler_debug)


def _patch_debug(module: Any) -> None:
    # aoti_compile_and_package imports aot_inductor_minifier_wrapper from the module at each call.
    module.aot_inductor_minifier_wrapper = _aoti_hook(module.aot_inductor_minifier_wrapper)


_INDUCTOR_PATCHES: dict[str, Callable[[Any], None]] = {
    "torch._inductor.compile_fx": _patch_compile_fx,
    "torch._inductor.debug": _patch_debug,
}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches each named module right after its first import has run it: the module is found by
    the finders after this one, as it would have been, and only its loader's `exec_module` is
    followed by the patch. Leaves `sys.meta_path` once every module is patched."""

    def __init__(self, patches: dict[str, Callable[[Any], None]]) -> None:
        self._patches = patches

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if fullname not in self._patches:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        execute, patch = loader.exec_module, self._patches[fullname]

        def exec_module(module: Any) -> None:
            execute(module)
            # Under the module's import lock: no other thread runs this module's import meanwhile.
            if self._patches.pop(fullname, None) is not None:
                patch(module)
            if not self._patches and self in sys.meta_path:
                sys.meta_path.remove(self)

        loader.exec_module = exec_module  # this spec's own loader: a finder makes one per spec
        return spec


def _notify(failed: FailedCompile) -> None:
    try:
        setattr(failed.error, _RECORDED, True)
    except AttributeError:  # an exception type with __slots__: it may be reported twice
        pass
    for listener in list(_listeners):
        try:
            listener.on_failure(failed)
        except Exception:  # a capture must never change what the user's code raises
            logger.exception("minify: recording a failing compile failed")


def _report(failed: Callable[[], FailedCompile]) -> None:
    """Notify the listeners of the failing call `failed()` describes; a failure to describe it
    (inputs that cannot be copied) is logged: the user's own error goes on as it was."""
    try:
        described = failed()
    except Exception:
        logger.exception("minify: recording a failing compile failed")
        return
    _notify(described)


def _recorded(error: BaseException) -> bool:
    """Whether an inner hook already reported `error` or one it wraps (a backward graph that
    failed inside the forward's dynamo call: the inner, more precise capture wins)."""
    seen: set[int] = set()
    stack: list[Any] = [error]
    while stack:
        current = stack.pop()
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        if getattr(current, _RECORDED, False):
            return True
        stack += [current.__cause__, current.__context__, getattr(current, "inner_exception", None)]
    return False


def _control_flow(error: BaseException) -> bool:
    """Exceptions dynamo uses to restart, skip or graph-break: not a compiler failing."""
    from torch._dynamo import exc

    return isinstance(error, (exc.RestartAnalysis, exc.SkipFrame, exc.Unsupported, IndexError))


def _copy_graph(gm: Any) -> Any:
    """The node list only: cheap, and all a passing compile pays (`_module` makes it runnable)."""
    return copy.deepcopy(gm.graph)


def _module(gm: Any, graph: Any) -> Any:
    """The copied graph as a module over `gm`'s attributes (built only when it is needed)."""
    import torch.fx as fx

    return fx.GraphModule(gm, graph)


def _dynamo_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call_user_compiler(self: Any, gm: Any, example_inputs: list[Any]) -> Any:
        if not _listeners:
            return original(self, gm, example_inputs)
        import torch

        graph = _copy_graph(gm)
        grad_enabled = torch.is_grad_enabled()

        def failed(error: BaseException, **facts: Any) -> FailedCompile:
            return FailedCompile(level="dynamo", error=error, backend=backend_name(self.compiler_fn),
                                 config=_config(self.compiler_fn), graph=_module(gm, graph),
                                 inputs=snapshot(example_inputs), symbolic=symbolic_values(graph, example_inputs),
                                 grad_enabled=grad_enabled, **facts)

        # Watched for hangs: the graph is written before its compile, dropped once it ends (crash.py).
        watched_compile = crash.watch_compile(list(_listeners), lambda: failed(
            crash.CompileHung("the graph's compile"),
            for_training=grad_enabled and any(getattr(value, "requires_grad", False) for value in example_inputs)))
        outer, _inside.watched = getattr(_inside, "watched", False), bool(watched_compile)
        try:
            compiled = original(self, gm, example_inputs)
        except Exception as error:
            if not _control_flow(error) and not _recorded(error):
                _report(lambda raised=error: failed(raised))
            raise
        finally:
            _inside.watched = outer
            crash.compile_ended(watched_compile)
        gradients, running = None, compiled
        if any(listener.accuracy for listener in _listeners) or os.environ.get(ACCURACY_ENV) == "1":
            if _check_accuracy(self.compiler_fn, _module(gm, graph), example_inputs, compiled):
                def gradients(args: tuple[Any, ...]) -> Callable[[Any], None] | None:
                    _check_gradients(self.compiler_fn, _module(gm, graph), example_inputs, compiled, args)
                    return _watch_versions(_module(gm, graph), args)
            running = _watch_aliasing(compiled, graph, example_inputs)
        # A run that raises is reported once, where eager runs the same inputs (`_watch_runs`).
        watched = _watch_runs(running, lambda error, args: _runtime_failure(
            error, args, self.compiler_fn, _module(gm, graph), example_inputs, grad_enabled), gradients)
        # The first run guarded for crashes, described with its own inputs (capture/crash.py).
        return crash.watch_compiled(watched, list(_listeners), lambda args: FailedCompile(
            level="dynamo", error=crash.CompiledCodeDied("the compiled graph's first run"),
            backend=backend_name(self.compiler_fn), config=_config(self.compiler_fn), graph=_module(gm, graph),
            inputs=list(args), symbolic=symbolic_values(graph, example_inputs),
            grad_enabled=grad_enabled))

    return call_user_compiler


def _aot_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrap_compiler_debug(compiler_fn: Callable[..., Any], compiler_name: str) -> Callable[..., Any]:
        wrapped = original(compiler_fn, compiler_name)

        @functools.wraps(wrapped)
        def inner_compile(gm: Any, example_inputs: Sequence[Any], *args: Any, **kwargs: Any) -> Any:
            backward = bool(kwargs.get("is_backward", False))
            # A backward graph is captured at this level always: no forward program reproduces
            # its failure. Forward graphs only when a listener asked for level "aot".
            # Inside AOTI the ExportedProgram is captured instead (the aoti hook).
            wanted = backward or any(listener.level == "aot" for listener in _listeners)
            if not _listeners or not wanted or getattr(_inside, "aoti", False):
                return wrapped(gm, example_inputs, *args, **kwargs)
            graph = _copy_graph(gm)

            def failed(error: BaseException) -> FailedCompile:
                return FailedCompile(level="aot", error=error, backend=compiler_name, config=_config(None),
                                     graph=_module(gm, graph), inputs=snapshot(example_inputs), is_backward=backward,
                                     symbolic=symbolic_values(graph, example_inputs))

            # Watched for hangs unless the dynamo graph around it already is (a backward compiled
            # lazily, at the first backward, is not).
            watched_compile = [] if getattr(_inside, "watched", False) else crash.watch_compile(
                list(_listeners), lambda: failed(crash.CompileHung("the graph's compile")))
            try:
                return wrapped(gm, example_inputs, *args, **kwargs)
            except Exception as error:
                if not _recorded(error):
                    _report(lambda raised=error: failed(raised))
                raise
            finally:
                crash.compile_ended(watched_compile)

        return inner_compile

    return wrap_compiler_debug


def _aoti_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def aot_inductor_minifier_wrapper(func: Callable[..., Any], exported_program: Any, **kwargs: Any) -> Any:
        if not _listeners:
            return original(func, exported_program, **kwargs)
        # The package flag is the call's own business (the worker's aot_inductor sets it).
        options = {key: value for key, value in (kwargs.get("inductor_configs") or {}).items()
                   if key != "aot_inductor.package"}

        def failed(error: BaseException) -> FailedCompile:
            return FailedCompile(level="aoti", error=error, backend="aot_inductor",
                                 config={**_config(None), **_json_only(options)}, program=exported_program)

        watched_compile = crash.watch_compile(list(_listeners),
                                              lambda: failed(crash.CompileHung("the program's compile")))
        _inside.aoti = True
        try:
            return original(func, exported_program, **kwargs)
        except Exception as error:
            if not _recorded(error):
                _notify(failed(error))
            raise
        finally:
            _inside.aoti = False
            crash.compile_ended(watched_compile)

    return aot_inductor_minifier_wrapper


def _config(compiler_fn: Any) -> dict[str, Any]:
    """The settings in effect, with the options torch.compile(options=..., mode=...) gave inductor:
    applied only while that compile runs, they are not in the config modules by now."""
    from .config import config_values

    values = config_values()
    options = getattr(getattr(compiler_fn, "_torchdynamo_orig_backend", compiler_fn), "config", None)
    if isinstance(options, dict):
        values.update(_json_only(options))
    return values


def _json_only(options: dict[str, Any]) -> dict[str, Any]:
    from .config import _json_value

    return {key: value for key, value in options.items() if isinstance(key, str) and _json_value(value)}


def backend_name(compiler_fn: Any) -> str:
    """The backend as the user named it: the string given to torch.compile ("inductor" for the
    default), else `module:name` of the callable where that imports back to it (a module-level
    name bound to it, as `fail_on_relu = raise_on("relu")`), else its repr."""
    backend = getattr(compiler_fn, "_torchdynamo_orig_backend", compiler_fn)  # torch's WrapBackendDebug
    function = getattr(backend, "compiler_fn", None)  # torch.compile's _TorchCompileWrapper
    name = getattr(backend, "compiler_name", None) or getattr(compiler_fn, "_compiler_name", None)
    if isinstance(name, str) and (function is None or _registered_as(name, function)):
        return name
    return _import_path(function or backend) or repr(function or backend)


def _registered_as(name: str, function: Any) -> bool:
    from torch._dynamo.backends.registry import lookup_backend

    try:
        return lookup_backend(name) is function
    except Exception:  # not a registered name: the wrapper took the function's __name__
        return False


def _import_path(function: Any) -> str | None:
    module_name, qualname = getattr(function, "__module__", None), getattr(function, "__qualname__", "")
    if not module_name or module_name == "__main__":  # a worker cannot import a script's names
        return None
    try:
        module: Any = importlib.import_module(module_name)
    except ImportError:
        return None
    if "<" not in qualname:
        found: Any = module
        for part in qualname.split("."):
            found = getattr(found, part, None)
        if found is function:
            return f"{module_name}:{qualname}"
    for attribute, value in vars(module).items():
        if value is function:
            return f"{module_name}:{attribute}"
    return None


def snapshot(values: Sequence[Any]) -> list[Any]:
    """The inputs as they are now (a program may write into them later): real tensors cloned,
    fake ones (AOT level) made from their metadata, symbolic sizes as their hints. Real tensors
    that share a storage (`t0` and `t0[1:]`) stay views of one copy of it (`accuracy.clone_inputs`):
    what a graph does with aliased inputs (AOT autograd's synthetic base) is part of what it
    computes, and torch.save keeps the sharing in inputs.pt for the worker."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._python_dispatch import _disable_current_modes

    from minify_contract.accuracy import aliased_inputs, clone_inputs

    with _disable_current_modes(), torch.no_grad():
        taken = [_snapshot_one(value, torch, FakeTensor) for value in values]
        for group in aliased_inputs(values):
            if all(not isinstance(values[position], FakeTensor) for position in group):
                copies = clone_inputs([values[position].detach() for position in group])
                for position, copied in zip(group, copies, strict=True):
                    taken[position] = copied
        return taken


def _snapshot_one(value: Any, torch: Any, fake_type: type) -> Any:
    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        return value.node.hint
    if not isinstance(value, torch.Tensor):
        return value
    if isinstance(value, fake_type) or value.device.type == "meta":
        return from_metadata(value)
    # A ZeroTensor stays one, a conjugate or negative view keeps its bit (clone() would lose them).
    return clone_input(value.detach())


def from_metadata(value: Any) -> Any:
    """A real tensor with `value`'s shape, strides, dtype and device: random floats, small ints."""
    import torch

    def concrete(sizes: Sequence[Any]) -> list[int]:
        return [int(size.node.hint) if isinstance(size, torch.SymInt) else int(size) for size in sizes]

    shape, strides = concrete(value.shape), concrete(value.stride())
    device = "cpu" if value.device.type == "meta" else value.device
    if value.dtype.is_floating_point or value.dtype.is_complex:
        made = torch.randn(shape, dtype=value.dtype, device=device)
    elif value.dtype == torch.bool:
        made = torch.rand(shape, device=device) > 0.5
    else:
        made = torch.randint(0, 8, shape, dtype=value.dtype, device=device)
    return torch.empty_strided(shape, strides, dtype=value.dtype, device=device).copy_(made)


def _watch_runs(compiled: Any, report: Callable[[BaseException, tuple[Any, ...]], None],
                first_run: Callable[[tuple[Any, ...]], Callable[[Any], None] | None] | None = None
                ) -> Callable[..., Any]:
    """`compiled` behind a wrapper that, when a run raises (a kernel's assertion, a shape check of
    the generated code), calls `report(error, args)` once per compiled graph, then re-raises the
    error as it was; and calls `first_run(args)` before the first run (the gradient check), and
    what it returns with that run's result (the version watch). A run that returns costs one
    Python call and nothing else."""
    reported = [False]
    pending = [first_run]

    def run(*args: Any, **kwargs: Any) -> Any:
        check, pending[0] = pending[0], None
        after = None
        if check is not None and _listeners:
            try:
                after = check(args)
            except Exception:  # a capture must never change what the user's code does
                logger.exception("minify: the gradient check failed")
        try:
            result = compiled(*args, **kwargs)
            if after is not None:
                try:
                    after(result)
                except Exception:
                    logger.exception("minify: watching the inputs' versions failed")
            return result
        except Exception as error:
            if _listeners and not reported[0] and not _recorded(error) and not _control_flow(error):
                reported[0] = True
                try:
                    report(error, args)
                except Exception:  # a capture must never change what the user's code raises
                    logger.exception("minify: recording a failing run failed")
            raise

    return run


def _runtime_failure(error: BaseException, args: tuple[Any, ...], compiler_fn: Any, graph: Any,
                     example_inputs: list[Any], grad_enabled: bool) -> None:
    """Report `error`, raised by a run of the compiled `graph` on `args`, as a `runtime_error`
    failure, unless eager raises on the same inputs too: then the program is wrong, not the
    compiler, and nothing is reported. Autograd and functorch state is put back, as the accuracy
    check puts it back; a graph of transforms runs eagerly lowered (`transforms.lower`)."""
    import torch

    from .transforms import lower, preserved_state, transform_calls

    if isinstance(error, MemoryError | torch.OutOfMemoryError):
        return  # the machine's memory, not the compiled code: and an eager run now would want it too
    inputs = snapshot(args)
    try:
        with preserved_state(), torch.random.fork_rng(devices=_cuda_devices(inputs)), torch.no_grad():
            eager = lower(graph, inputs, grad_enabled=grad_enabled) if transform_calls(graph.graph) else graph
            eager(*[clone_input(value) if isinstance(value, torch.Tensor) else value for value in inputs])
    except Exception as eager_error:
        logger.debug("minify: a compiled graph raised and so does eager (%s): not captured", eager_error)
        return
    _notify(FailedCompile(
        level="dynamo", error=error, backend=backend_name(compiler_fn), config=_config(compiler_fn), graph=graph,
        inputs=inputs, kind="runtime_error", symbolic=symbolic_values(graph.graph, example_inputs),
        grad_enabled=grad_enabled))


def _check_gradients(compiler_fn: Any, graph: Any, example_inputs: list[Any], compiled: Any,
                     args: tuple[Any, ...]) -> None:
    """The gradient check of a training step (MINIFY_CAPTURE_ACCURACY=1), at the compiled graph's
    first run, with its inputs, where grad mode is on and an input requires grad: a backward of the
    sum of the outputs, compiled and eager, the gradients of the inputs that require grad compared
    (`accuracy.gradient_divergence`); a difference is a `GradientError`. It runs here, not with the
    forward check inside dynamo's compile: a backward compiled there sets dynamo's compile metrics
    twice, which raises in the user's program. The compiled backward it compiles is the one the
    training step then reuses; autograd, functorch and random state are put back."""
    import torch

    from minify_contract.accuracy import GradientError, gradient_divergence, gradient_inputs

    from .transforms import preserved_state

    positions = gradient_inputs(args, requiring_grad_only=True)
    if not torch.is_grad_enabled() or not positions:
        return
    inputs = snapshot(args)
    try:
        with preserved_state(), torch.random.fork_rng(devices=_cuda_devices(inputs)):
            detail = gradient_divergence(graph, inputs, compiled, positions)
    except Exception as error:  # best effort: a graph it cannot differentiate is not the user's failure
        _skipped("gradient", error)
        return
    if detail is not None:
        _report(lambda: FailedCompile(
            level="dynamo", error=GradientError(detail), backend=backend_name(compiler_fn),
            config=_config(compiler_fn), graph=graph, inputs=inputs, kind="accuracy",
            symbolic=symbolic_values(graph.graph, example_inputs), grad_enabled=True))


def _watch_versions(graph: Any, args: tuple[Any, ...]) -> Callable[[Any], None] | None:
    """For a training step's first run (MINIFY_CAPTURE_ACCURACY=1): what, given the run's result,
    watches for an input modified in place between the forward and the backward, where eager's
    autograd raises ("modified by an inplace operation") for a tensor it saved and a compiled
    backward may not check (pytorch#197887). At the backward (a pre-hook on the first output's
    autograd node: it changes no gradient) an input whose version moved is tried eagerly: the graph
    run on copies of the forward's inputs, that input bumped in place, a backward; where eager
    raises so, a warning says so. No graph a compiler received holds the modification, so nothing
    is captured: the warning names the input and eager's error. None where grad mode is off."""
    import weakref

    import torch
    from torch.utils._pytree import tree_leaves

    if not torch.is_grad_enabled():
        return None
    inputs = snapshot(args)
    requires = [isinstance(value, torch.Tensor) and value.requires_grad for value in args]

    def after(result: Any) -> None:
        outputs = [value for value in tree_leaves(result) if isinstance(value, torch.Tensor) and value.grad_fn]
        if not outputs:
            return
        versions = [(position, weakref.ref(value), value._version) for position, value in enumerate(args)
                    if isinstance(value, torch.Tensor)]
        fired = [False]

        def before_backward(grad_outputs: Any) -> None:
            if fired[0]:
                return None
            fired[0] = True
            moved = [position for position, ref, version in versions
                     if (value := ref()) is not None and value._version != version]
            if moved:
                try:
                    _tell_lost_version_check(graph, inputs, requires, moved)
                except Exception:
                    logger.debug("minify: the in-place check was skipped", exc_info=True)
            return None

        outputs[0].grad_fn.register_prehook(before_backward)

    return after


def _tell_lost_version_check(graph: Any, inputs: list[Any], requires: list[bool], moved: list[int]) -> None:
    import torch
    from torch.utils._pytree import tree_leaves

    from .transforms import preserved_state

    with preserved_state(), torch.random.fork_rng(devices=_cuda_devices(inputs)), torch.enable_grad():
        copies = [value.clone().requires_grad_(wanted) if isinstance(value, torch.Tensor) else value
                  for value, wanted in zip(inputs, requires, strict=True)]
        outputs = [value for value in tree_leaves(graph(*copies))
                   if isinstance(value, torch.Tensor) and value.requires_grad and value.is_floating_point()]
        with torch.no_grad():
            for position in moved:
                copies[position].add_(0)  # what the program did to it, as autograd counts it: a version
        leaves = [copies[position] for position, wanted in enumerate(requires) if wanted]
        if not outputs or not leaves:
            return
        try:
            torch.autograd.grad(sum(output.sum() for output in outputs), leaves, allow_unused=True)
        except RuntimeError as error:
            if "inplace operation" not in str(error):
                return
            said = str(error).strip().splitlines()[0][:300]
            which = ", ".join(f"{position} ({str(inputs[position].dtype).removeprefix('torch.')} "
                              f"{tuple(inputs[position].shape)})" for position in moved)
            logger.warning(
                "minify: input%s %s of a compiled training graph %s modified in place between its forward and its "
                "backward: eager's autograd raises there (RuntimeError: %s) and the compiled backward did not "
                "(a missing error, as pytorch#197887). Not captured: no graph a compiler received holds the "
                "modification; report it with your program", "s" if len(moved) > 1 else "", which,
                "were" if len(moved) > 1 else "was", said)


def _watch_aliasing(compiled: Any, graph: Any, example_inputs: list[Any]) -> Any:
    """MINIFY_CAPTURE_ACCURACY=1, a graph that writes into an input: `compiled` behind a wrapper
    that says, once, when a run's inputs share memory otherwise than the inputs it was compiled
    for (`accuracy.aliased_inputs`). AOT autograd compiles a graph that mutates an input for the
    aliasing it saw (a synthetic base where inputs alias); dynamo should guard on it and
    recompile, and where it does not (pytorch#139789) the run is wrong while every graph a
    compiler received is right for its own inputs: compiled for these inputs, the graph handles
    them. Nothing is captured; the warning says so. Other graphs are returned as they are."""
    from minify_contract.accuracy import aliased_inputs

    written = _written_placeholders(graph)
    if not written:
        return compiled
    compiled_for = aliased_inputs(example_inputs)
    said = [False]

    def run(*args: Any, **kwargs: Any) -> Any:
        if not said[0]:
            try:
                aliasing = aliased_inputs(args)
                if aliasing != compiled_for:
                    said[0] = True
                    _tell_aliasing_reused(written, compiled_for, aliasing)
            except Exception:  # a capture must never change what the user's code does
                logger.debug("minify: watching the inputs' aliasing failed", exc_info=True)
        return compiled(*args, **kwargs)

    return run


def _written_placeholders(graph: Any) -> list[str]:
    """The graph's inputs an in-place op (a method or function named `..._`, as `mul_`) writes."""
    placeholders = [node for node in graph.nodes if node.op == "placeholder"]
    written: list[str] = []
    for node in graph.nodes:
        name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
        if node.op not in ("call_method", "call_function") or not isinstance(name, str):
            continue
        if name.endswith("_") and not name.endswith("__") and node.args and node.args[0] in placeholders \
                and node.args[0].name not in written:
            written.append(node.args[0].name)
    return written


def _tell_aliasing_reused(written: list[str], compiled_for: list[list[int]], aliasing: list[list[int]]) -> None:
    def said(groups: list[list[int]]) -> str:
        return ", ".join(" and ".join(map(str, group)) for group in groups) or "no memory"

    logger.warning(
        "minify: dynamo reused, without recompiling, a graph compiled for inputs sharing %s on inputs sharing %s "
        "(a missing guard on input aliasing, as pytorch#139789): the graph writes into %s, and AOT autograd compiled "
        "that for the aliasing it saw, so this run can differ from eager. Not captured: no graph is wrong for its "
        "own inputs (compiled for these, it handles them). Report it with your program; until fixed, clone "
        "overlapping inputs before the call", said(compiled_for), said(aliasing), ", ".join(written))


def _check_accuracy(compiler_fn: Any, graph: Any, example_inputs: list[Any], compiled: Any) -> bool:
    """MINIFY_CAPTURE_ACCURACY=1: the compiled graph's first outputs against eager, with the
    worker's own accuracy oracle (fp64 reference, tolerance 1e-3, non-strict); a graph that raises
    eagerly and returns compiled is a `MissingError` (`_judged`). True when the outputs agreed on a
    graph without transforms: its gradients are judged at its first run (`_check_gradients`).

    It runs inside dynamo's compile of the user's frame, so whatever it does, the autograd and
    functorch state dynamo guards on is put back (`transforms.preserved_state`). A graph of
    torch.func transforms is judged lowered to the aten ops it computes (`transforms.lower`), and
    its compiled code runs in the grad mode it was compiled in, as the user's program runs it."""
    import torch

    from .transforms import lower, preserved_state, transform_calls

    grad_enabled = torch.is_grad_enabled()
    try:
        # The random state too: the check's runs must not change the numbers the program draws next.
        with preserved_state(), torch.random.fork_rng(devices=_cuda_devices(example_inputs)):
            inputs = snapshot(example_inputs)
            transforms = bool(transform_calls(graph.graph))
            if transforms:
                graph = lower(graph, inputs, grad_enabled=grad_enabled)
            found = _judged(graph, inputs, _run_compiled(compiled, grad_enabled if transforms else None))
    except Exception as error:  # the check is best effort: a graph it cannot run is not the user's failure
        _skipped("accuracy", error)
        return False
    if found is not None:
        _report(lambda: FailedCompile(
            level="dynamo", error=found, backend=backend_name(compiler_fn),
            config=_config(compiler_fn), graph=graph, inputs=snapshot(example_inputs), kind="accuracy",
            symbolic=symbolic_values(graph.graph, example_inputs), grad_enabled=grad_enabled))
    return found is None and not transforms


def _skipped(check: str, error: Exception) -> None:
    """Say once per reason that a check could not judge a graph: its outputs go unjudged, so a
    wrong value there is not captured."""
    reason = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}".rstrip(": ")[:200]
    logger.debug("minify: %s check skipped", check, exc_info=True)
    if reason not in skipped_checks:
        skipped_checks.append(reason)
        logger.warning("minify: the %s check could not judge a compiled graph (%s): wrong values there are not "
                       "captured", check, reason)


def _cuda_devices(values: Sequence[Any]) -> list[int]:
    import torch

    return sorted({value.device.index or 0 for value in values
                   if isinstance(value, torch.Tensor) and value.device.type == "cuda"})


def _judged(graph: Any, inputs: list[Any], run: Callable[[list[Any]], Any]) -> Exception | None:
    """What the compiled graph gets wrong on `inputs`, as the worker judges it: eager raises and it
    returns (`MissingError`), its outputs differ (`AccuracyError`); None when it agrees, or when
    both raise. Outputs that pass only by the fp64 reference, beyond the tolerance of eager's in
    whole units (a floor, a round), are said in a warning (`accuracy.beyond_tolerance`)."""
    import torch

    from minify_contract.accuracy import AccuracyError, beyond_tolerance, clone_inputs, compare_to_eager, missing_error

    try:
        with torch.no_grad():
            reference = graph(*clone_inputs(inputs))
    except Exception as eager_error:
        try:
            with torch.no_grad():
                run(clone_inputs(inputs))
        except Exception:
            return None  # both raise: the program's own error
        return missing_error(eager_error)
    results: list[Any] = []
    divergence = compare_to_eager(graph, inputs, lambda args: results.append(run(args)) or results[-1])
    if divergence is not None:
        return AccuracyError(divergence)
    sizes = _sizes_differ(graph, inputs, reference, results[0]) if results else None
    if sizes is not None:  # a size rounding decided, which the rule passes: said
        logger.warning("%s", sizes)
        return None
    far = beyond_tolerance(reference, results[0]) if results else None
    if far is None and results:
        _note_inexact(reference, results[0])
    if far is not None:
        logger.warning(
            "minify: a compiled graph's outputs differ from eager's beyond the tolerance (%s), but are no further "
            "from the fp64 reference than eager's own (eager's rounding decided them, as a floor or a comparison "
            "of a rounded value does): torch's accuracy rule passes them, and so does minify's; not captured",
            far)
    return None


# Graphs the accuracy check passed whose floating-point outputs were not eager's bit for bit (at
# most a few, said only where the program then failed with nothing captured: `passed_inexact`).
_INEXACT: list[str] = []


def _note_inexact(reference: Any, result: Any) -> None:
    import torch
    from torch.utils._pytree import tree_leaves

    for position, (expected, got) in enumerate(zip(tree_leaves(reference), tree_leaves(result), strict=False)):
        if not (isinstance(expected, torch.Tensor) and isinstance(got, torch.Tensor)) \
                or not expected.is_floating_point() or expected.shape != got.shape or len(_INEXACT) >= 3:
            continue
        differs = got.detach().to(expected.device) != expected.detach()
        differs &= ~(expected.isnan() & got.detach().to(expected.device).isnan())
        if bool(differs.any()):
            most = float((got.detach().double().to(expected.device) - expected.double()).abs()[differs].max())
            _INEXACT.append(f"output {position}: {int(differs.sum())} of {expected.numel()} "
                            f"{str(expected.dtype).removeprefix('torch.')} values differ from eager's by up to "
                            f"{most:.2g}")


def passed_inexact() -> list[str]:
    """What the accuracy check passed, within the tolerance, that was not eager's bit for bit (the
    first few graphs' outputs): where the program failed anyway and nothing was captured, eager code
    after a graph break that compares or counts exact values (pytorch#148859: `unique_consecutive`
    after a compiled upsample) may have turned such differences into its failure."""
    return list(_INEXACT)


def _sizes_differ(graph: Any, inputs: list[Any], reference: Any, result: Any) -> str | None:
    """What to say of a compiled graph the accuracy rule passed though a floating-point output has
    another shape than eager's (a size the values decide: `unique`, `unique_consecutive`,
    `masked_select`, compiled under dynamo's `capture_dynamic_output_shape_ops`); None when none
    does. The rule (`minify_contract.accuracy.size_divergence`) fails a size the fp64 reference
    shares with eager; it passes one where the reference's size is not eager's, since eager's own
    rounding decided the size as much as the compiled code's (pytorch#148859: a floor and an upsample
    whose last-bit differences `unique_consecutive` turns into 2201 values, eager 2224, fp64 2206),
    and one without a reference."""
    import torch
    from torch.utils._pytree import tree_leaves

    from minify_contract.accuracy import fp64_reference

    precise_leaves: list[Any] | None = None  # the fp64 reference's outputs, computed once, at the first size
    for position, (expected, got) in enumerate(zip(tree_leaves(reference), tree_leaves(result), strict=False)):
        if not (isinstance(expected, torch.Tensor) and isinstance(got, torch.Tensor)) \
                or not expected.is_floating_point() or expected.shape == got.shape:
            continue
        if precise_leaves is None:
            try:
                precise_leaves = tree_leaves(fp64_reference(graph, inputs))
            except Exception:  # no reference: the size cannot be judged
                precise_leaves = []
        precise = precise_leaves[position] if position < len(precise_leaves) else None
        said = (f"minify: a compiled graph's output {position} ({str(expected.dtype).removeprefix('torch.')}) has "
                f"shape {tuple(got.shape)} where eager's has {tuple(expected.shape)} (a size the values decide, as "
                "unique or masked_select give)")
        if not isinstance(precise, torch.Tensor):
            return (f"{said}; without an fp64 reference it cannot be told from rounding, so the accuracy rule "
                    "passes it (as torch's does without one): not captured")
        if precise.shape == expected.shape:
            continue  # a wrong size: the accuracy rule judged it (`minify_contract.accuracy.size_divergence`)
        return (f"{said}, and the fp64 reference's is {tuple(precise.shape)}, not eager's: eager's own rounding "
                "decides the size as much as the compiled code's (the op turns differences within the tolerance "
                "into another size), so by torch's accuracy rule, and minify's, this is not a compiler error; not "
                "captured. Next: compute the values the size depends on in float64, or round them first")
    return None


def _run_compiled(compiled: Any, grad_enabled: bool | None = None) -> Callable[[list[Any]], Any]:
    """Call a backend's result as dynamo's generated code does: with the inputs as *args; in the
    grad mode `grad_enabled` when given (the check's own is no_grad)."""
    import torch

    def run(inputs: list[Any]) -> Any:
        if grad_enabled is None:
            return compiled(*inputs)
        with torch.set_grad_enabled(grad_enabled):
            return compiled(*inputs)

    return run
