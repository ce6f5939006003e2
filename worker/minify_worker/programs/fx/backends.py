"""The backends a candidate is compiled with, and the inductor config it is compiled under.

A backend is a function `compile(gm, inputs) -> callable`: raising means a compile error, the
callable raising means a runtime error. Runs in sandbox children only.

- `inductor`: `torch._inductor.compile_fx.compile_fx` on the aten graph, under `torch.no_grad()`.
- `aot_inductor`: `torch.export.export` of the candidate, `aoti_compile_and_package` into a
  temp dir in the job's work dir, `aoti_load_package`, and the loaded package is what runs.
- `aot_eager`, `eager`: torch's own debug backends.
- `"pkg.module:callable"`: a torch.compile backend `fn(gm, example_inputs) -> callable`, imported
  only when its module path starts with one of the comma-separated prefixes in
  `MINIFY_ALLOWED_BACKENDS`.
- any other name: a torch.compile backend registered on this worker (`torch._dynamo.list_backends`,
  torch's own and those of the `torch_dynamo_backends` entry point: `tensorrt`, `openxla`, ...),
  looked up with `torch._dynamo.lookup_backend`. Installing the package is what allows it. Such a
  backend is written against the graphs dynamo hands it, whose ops are torch functions
  (`torch.relu`), while a candidate's ops are aten overloads (`aten.relu.default`): it receives
  the candidate with each aten op that torch has a function for called through that function
  (`as_torch_functions`), as it would receive a user's program.

Dynamic shapes (`DynamicShapes`, from the placeholders' `minify_tensor["dynamic"]` and the spec's
`dynamic`): a candidate with dims to keep symbolic goes through `torch.compile(gm, backend=...,
fullgraph=True)` with those dims marked (`torch._dynamo.mark_dynamic` with the program's range, or
`maybe_mark_dynamic` for `auto`) and every other tensor dim marked static (`mark_static`, whatever
dynamo's config assumes), so the backend receives what dynamo gives it for a user's
dynamic compile: placeholders whose example values have SymInt sizes, the size symbols lifted to
SymInt inputs, and a tracing context whose ShapeEnv knows the ranges (inductor and aot_autograd
read it from there). Re-tracing with make_fx over hand-made symbolic fake inputs would give the
sizes but not the rest without torch's private plumbing, and repro.py can say the same two
public calls. `aot_inductor` exports with `dynamic_shapes` instead (`export_dynamic_shapes`).
"""

from __future__ import annotations

import copy
import functools
import importlib
import logging
import sys
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import fx

from minify_contract.accuracy import clone_input
from minify_contract.config_keys import config_setting
from minify_contract.models import BUILTIN_BACKENDS
from minify_worker.allowlist import allowed_prefixes

logger = logging.getLogger(__name__)

Compiled = Callable[..., Any]
Backend = Callable[[fx.GraphModule, list[Any]], Compiled]

ALLOWED_BACKENDS_ENV = "MINIFY_ALLOWED_BACKENDS"
# torch.compile's debug backends a candidate may use: the spec's two, and the stages between them
# that the compiler bisector probes (the culprit phase; never a spec's backend).
REGISTERED_BACKENDS = ("aot_eager", "eager", "aot_eager_decomp_partition", "aot_eager_decomp_partition_crossref")


class BackendError(Exception):
    """The job's backend or config cannot be used: a problem of the job, not of a candidate."""


def _module_allowed(module: str, prefixes: list[str]) -> bool:
    return any(module.startswith(prefix) for prefix in prefixes)


def load_custom_backend(name: str) -> Backend:
    """Import `pkg.module:callable` if `MINIFY_ALLOWED_BACKENDS` allows its module."""
    module_name, _, attribute = name.partition(":")
    prefixes = allowed_prefixes(ALLOWED_BACKENDS_ENV)
    if not _module_allowed(module_name, prefixes):
        raise BackendError(
            f"custom backend {name!r} is not allowed: its module must start with one of the prefixes in "
            f"{ALLOWED_BACKENDS_ENV} (now {','.join(prefixes) or 'empty'}); the worker's operator sets it"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise BackendError(f"custom backend {name!r}: cannot import {module_name}: {error}") from error
    backend = getattr(module, attribute, None)
    if not callable(backend):
        raise BackendError(f"custom backend {name!r}: {module_name} has no callable {attribute!r}")
    return backend


def _call(compiled: Compiled, args: list[Any]) -> Any:
    """Call what a torch.compile backend returned, as dynamo does: unboxed. (Its `_boxed_call`
    attribute is not reliable: `functools.wraps` copies it onto unboxed wrappers.)"""
    return compiled(*args)


def _inductor(gm: fx.GraphModule, inputs: list[Any], *, training: bool = False) -> Compiled:
    """Inductor under `torch.no_grad()`; for a training step (`training`) as torch.compile calls it
    then: grad mode on, so that AOT autograd traces the joint forward-and-backward graph of inputs
    requiring grad and partitions it."""
    from torch._inductor.compile_fx import compile_fx

    grad_mode = torch.enable_grad if training else torch.no_grad
    with grad_mode():
        compiled = compile_fx(gm, list(inputs))

    def run(*args: Any) -> Any:
        with grad_mode():
            return _call(compiled, list(args))

    return run


def for_training(inputs: Sequence[Any]) -> list[Any]:
    """`inputs` as a training step passes them: every floating-point tensor a leaf requiring grad,
    a copy that is what the input is (`clone_input`: a ZeroTensor stays one, a view keeps its bits)."""
    return [clone_input(value.detach()).requires_grad_(True)
            if isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex()) else value
            for value in inputs]


def _aot_inductor(workdir: Path, shapes: DynamicShapes | None) -> Backend:
    def compile_aoti(gm: fx.GraphModule, inputs: list[Any]) -> Compiled:
        import torch._inductor

        package_dir = Path(tempfile.mkdtemp(prefix="aoti-", dir=workdir))
        with torch.no_grad():
            exported = torch.export.export(gm, tuple(inputs), dynamic_shapes=export_dynamic_shapes(shapes))
            package = torch._inductor.aoti_compile_and_package(
                exported, package_path=str(package_dir / "candidate.pt2")
            )
            loaded = torch._inductor.aoti_load_package(package)

        def run(*args: Any) -> Any:
            with torch.no_grad():
                return loaded(*args)

        return run

    return compile_aoti


def _registered(name: str) -> Backend:
    def compile_registered(gm: fx.GraphModule, inputs: list[Any]) -> Compiled:
        from torch._dynamo.backends.registry import lookup_backend

        return lookup_backend(name)(gm, list(inputs))

    return compile_registered


def registered_backend(name: str) -> Backend:
    """A torch.compile backend registered on this worker under `name`, given each candidate in
    dynamo's form (`as_torch_functions`); `BackendError` naming the registered ones if there is none."""
    from torch._dynamo.backends.registry import list_backends

    registered = list_backends(exclude_tags=())
    if name not in registered:
        raise BackendError(f"backend {name!r} is not registered on this worker; it has: {', '.join(registered)}")
    compile_fn = _registered(name)

    def compile_torch_functions(gm: fx.GraphModule, inputs: list[Any]) -> Compiled:
        return compile_fn(as_torch_functions(gm, inputs), inputs)

    return compile_torch_functions


def uses_torch_functions(name: str) -> bool:
    """Whether the backend `name` receives candidates in dynamo's form (`as_torch_functions`):
    the registered backends other than the built-in ones, which compile aten graphs as they are."""
    return name not in BUILTIN_BACKENDS and ":" not in name


def resolve_backend(name: str, workdir: Path, shapes: DynamicShapes | None = None,
                    training: bool = False) -> Backend:
    """The compile function for the spec's `backend` (raises `BackendError` if it cannot be used),
    compiling the dims in `shapes` symbolically (see the module's docstring), and the program's
    constant tensors as constants (`constants_inside`); with `training` (`FailureSpec.training`),
    inductor compiles with grad mode on (the caller passes inputs `for_training`; other backends
    compile in the grad mode they are called in, which is on)."""
    _backend(name, workdir, None, training)  # a backend that cannot be used says so now, not at the first compile
    return constants_inside(lambda kept: _backend(name, workdir, kept, training), shapes)


def _backend(name: str, workdir: Path, shapes: DynamicShapes | None, training: bool = False) -> Backend:
    if name == "aot_inductor":
        return _aot_inductor(workdir, shapes)
    if name == "inductor":
        backend = functools.partial(_inductor, training=training)
    elif name in REGISTERED_BACKENDS:
        backend = _registered(name)
    elif ":" in name:
        backend = load_custom_backend(name)
    else:
        backend = registered_backend(name)
    return backend if shapes is None else _through_dynamo(backend, shapes)


# ---------------------------------------------------------------------------------------------
# Constants


def constant_positions(graph: fx.Graph) -> list[int]:
    """The positions among `graph`'s placeholders of the program's constant tensors (role
    "constant": torch.export's CONSTANT_TENSOR inputs, `c_lifted_tensor_0`)."""
    from minify_worker.programs.fx.graph import META_ROLE

    placeholder_nodes = [node for node in graph.nodes if node.op == "placeholder"]
    return [position for position, node in enumerate(placeholder_nodes) if node.meta.get(META_ROLE) == "constant"]


def constants_as_attributes(gm: fx.GraphModule, inputs: Sequence[Any],
                            positions: Sequence[int]) -> tuple[fx.GraphModule, list[Any]]:
    """A copy of `gm` whose placeholders at `positions` are tensor attributes of the module
    (get_attr nodes of the values `inputs` holds there), and the inputs it takes: the others.

    A tensor a program builds from literals (`torch.tensor([10**9])`) is a constant in the graph a
    compiler receives from torch.compile (AOT autograd's `_tensor_constant0`), which inductor folds
    into its kernels; torch.export lifts it to an input. Compiled as an input it is another program,
    which may not fail as the user's did (an int64 product computed in 32 bits only when one factor
    is a known constant: pytorch#175966). repro.py does the same, in plain torch."""
    module = copy.deepcopy(gm)
    placeholder_nodes = [node for node in module.graph.nodes if node.op == "placeholder"]
    body = next(node for node in module.graph.nodes if node.op != "placeholder")
    kept = []
    for position, (node, value) in enumerate(zip(placeholder_nodes, inputs, strict=True)):
        if position not in positions or not isinstance(value, torch.Tensor):
            kept.append(value)
            continue
        setattr(module, node.name, value.detach().clone())  # a plain attribute, as AOT autograd's constants
        with module.graph.inserting_before(body), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # FX warns of any attribute but a buffer or parameter
            attribute = module.graph.get_attr(node.name)
        attribute.meta = dict(node.meta)
        node.replace_all_uses_with(attribute)
        module.graph.erase_node(node)
    module.recompile()
    return module, kept


def constants_inside(make: Callable[[DynamicShapes | None], Backend], shapes: DynamicShapes | None) -> Backend:
    """The backend `make` gives, compiling each candidate with its constant tensors as constants
    (`constants_as_attributes`) and the dims of its other inputs in `shapes`; what it returns
    takes the candidate's inputs as they are, constants included (it drops them)."""

    def compile_with_constants(gm: fx.GraphModule, inputs: list[Any]) -> Compiled:
        positions = [position for position in constant_positions(gm.graph)
                     if position < len(inputs) and isinstance(inputs[position], torch.Tensor)]
        if not positions:
            return make(shapes)(gm, inputs)
        kept_shapes = None if shapes is None else DynamicShapes(
            shapes.mode, tuple(dims for position, dims in enumerate(shapes.dims) if position not in positions))
        module, kept = constants_as_attributes(gm, inputs, positions)
        compiled = make(kept_shapes)(module, kept)
        dropped = set(positions)

        def run(*args: Any) -> Any:
            return _call(compiled, [value for position, value in enumerate(args) if position not in dropped])

        return run

    return compile_with_constants


# ---------------------------------------------------------------------------------------------
# Dynamo's form of a graph, for registered backends


def _torch_function(target: Any) -> Callable[..., Any] | None:
    """The torch function a user calls for the aten op `target` (`torch.relu` for
    `aten.relu.default`): the same-named function of torch's generated bindings, which dispatch
    to that op's overloads; None where torch has none (methods such as `view`, Python wrappers
    such as `torch.split`, ops of other namespaces)."""
    if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
        return None
    name = target.overloadpacket.__name__
    function = getattr(torch, name, None)
    return function if function is not None and getattr(torch._C._VariableFunctions, name, None) is function else None


def as_torch_functions(gm: fx.GraphModule, inputs: Sequence[Any]) -> fx.GraphModule:
    """A copy of `gm` whose aten ops call their torch function (`_torch_function`) where it gives
    what the op gives: each swap is checked by running both on meta copies of `inputs` (same
    shapes and dtypes, no data, no computation); an op whose function binds other arguments or
    gives other results keeps its aten overload. `gm` itself when nothing is swapped, or when the
    graph cannot run on meta tensors (a data-dependent op): dynamo's form is a courtesy to
    backends written against it, never a reason for a candidate to fail differently."""
    swaps = {node.name: function for node in gm.graph.nodes
             if node.op == "call_function" and (function := _torch_function(node.target)) is not None}
    if not swaps:
        return gm
    try:
        agreeing = _agreeing_swaps(gm, inputs, swaps)
    except Exception:
        return gm
    if not agreeing:
        return gm
    graph = fx.Graph()
    copies: dict[fx.Node, fx.Node] = {}
    graph.output(graph.graph_copy(gm.graph, copies))
    for node, copied in copies.items():
        if node.name in agreeing:
            copied.target = agreeing[node.name]
    return fx.GraphModule(gm, graph)


def _agreeing_swaps(gm: fx.GraphModule, inputs: Sequence[Any],
                    swaps: dict[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """The swaps whose torch function, called with the node's own arguments on meta tensors, gives
    results of the same structure, shapes and dtypes as its aten op. Meta tensors rather than fake
    ones: a tenth of the time (0.1 s against 1.1 s for a 140-op transformer stack), and a factory
    op's device is made meta too, so nothing is allocated."""
    from torch.utils._pytree import tree_leaves

    def same(left: Any, right: Any) -> bool:
        lefts, rights = tree_leaves(left), tree_leaves(right)
        if len(lefts) != len(rights):
            return False
        for a, b in zip(lefts, rights, strict=True):
            if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
                return False
            if isinstance(a, torch.Tensor) and (a.shape, a.dtype) != (b.shape, b.dtype):
                return False
        return True

    agreeing: dict[str, Callable[..., Any]] = {}

    class Check(fx.Interpreter):
        def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
            return super().call_function(target, args, _on_meta(kwargs))

        def run_node(self, node: fx.Node) -> Any:
            result = super().run_node(node)
            if node.name in swaps:
                args, kwargs = self.fetch_args_kwargs_from_env(node)
                try:
                    swapped = swaps[node.name](*args, **_on_meta(kwargs))
                except Exception:
                    return result
                if same(result, swapped):
                    agreeing[node.name] = swaps[node.name]
            return result

    with torch.no_grad():
        Check(gm).run(*[value.to("meta") if isinstance(value, torch.Tensor) else value for value in inputs])
    return agreeing


def _on_meta(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A factory op's keyword arguments with its device made meta (`torch.full(..., device=cpu)`)."""
    return {**kwargs, "device": torch.device("meta")} if "device" in kwargs else kwargs


# ---------------------------------------------------------------------------------------------
# Dynamic shapes


@dataclass(frozen=True)
class DynamicShapes:
    """The dims a candidate compiles symbolically: per input, in placeholder order, `{dim: spec}`
    with the spec of `graph.dynamic_dims`; `mode` is the JobSpec's `dynamic` ("as_exported" or
    "auto")."""

    mode: str
    dims: tuple[dict[int, dict[str, Any]], ...]


def dynamic_shapes_of(graph: fx.Graph, mode: str) -> DynamicShapes | None:
    """What `graph`'s placeholders record as dynamic (nothing when `mode` is "static"), or None
    when the candidate compiles without dynamo: nothing is dynamic and the graph is not
    `data_dependent`. A data-dependent graph with static inputs goes through dynamo all the same,
    every dim marked static: its sizes read from data need the ShapeEnv dynamo makes."""
    placeholder_nodes = [node for node in graph.nodes if node.op == "placeholder"]
    dims = tuple({} if mode == "static" else
                 {int(axis): dim for axis, dim in (node.meta.get("minify_tensor") or {}).get("dynamic", {}).items()}
                 for node in placeholder_nodes)
    return DynamicShapes(mode, dims) if any(dims) or data_dependent(graph) else None


def data_dependent(graph: fx.Graph) -> bool:
    """Whether `graph` reads a size or a scalar from tensor data: an op torch tags
    `data_dependent_output` (`.item()`, `_local_scalar_dense`, `equal`), or a node whose size is an
    unbacked symbol (`nonzero`, a boolean mask, `masked_select`: its shape is recorded as `u0`).

    A user compiles such a graph under dynamo with `capture_scalar_outputs` /
    `capture_dynamic_output_shape_ops`; inductor and aot_autograd given a plain graph make a fake
    mode without a ShapeEnv, in which these ops raise `DynamicOutputShapeException` or
    `DataDependentOutputException` before the backend sees the graph: not the user's failure.

    So does a `while_loop` that carries a number (pytorch#166525's counter): dynamo gives the
    compiler its carry as an unbacked symbol, and inductor without a ShapeEnv fails on it before the
    lowering does ("'NoneType' object has no attribute 'ignore_fresh_unbacked_symbols'")."""
    data_tag = torch.Tag.data_dependent_output
    for node in graph.nodes:
        if node.op == "call_function" and data_tag in getattr(node.target, "tags", ()):
            return True
        shape = (node.meta.get("minify_tensor") or {}).get("shape", ())
        if any(not isinstance(size, int) for size in shape):
            return True
    return loop_carries_a_number(graph)


def loop_carries_a_number(graph: fx.Graph) -> bool:
    """Whether a `while_loop` of `graph` carries a number (a literal or a scalar node) in its state."""
    for node in graph.nodes:
        if node.op != "call_function" or node.target is not torch.ops.higher_order.while_loop:
            continue
        carried = node.args[2] if len(node.args) > 2 and isinstance(node.args[2], list | tuple) else ()
        if any(not isinstance(value, fx.Node) or value.meta.get("minify_kind") == "scalar" for value in carried):
            return True
    return False


def size_range(dim: dict[str, Any]) -> tuple[int | None, int | None]:
    """The range of one dynamic dim's size (`scale * [min, max] + offset`; None: unbounded)."""
    scale, offset = dim.get("scale", 1), dim.get("offset", 0)
    low, high = dim.get("min"), dim.get("max")
    return (None if low is None else scale * low + offset, None if high is None else scale * high + offset)


def mark_dynamic(inputs: Sequence[Any], shapes: DynamicShapes) -> bool:
    """Mark the dims of `inputs` for dynamo as the program has them: each dynamic one with its
    range (`as_exported`), or as automatic dynamic marks a dim it saw change, which the graph may
    still specialize (`auto`); every other dim of a tensor static. True when some dims are left
    unmarked to share one symbol (`shared_dims`): the compile must then run with
    `assume_static_by_default=False` and duck sizing on (`use_duck_shape`).

    Static by a mark, not by dynamo's default: a capture of `torch.compile(dynamic=True)` records
    the `assume_static_by_default=False` that it sets, which would make every unmarked dim
    symbolic, a module's weights included (dynamo keeps a user's parameters static, but here they
    are plain inputs). Such a candidate is another program than the one exported, and inductor may
    fail on it where the program compiles (a ResNet's strided conv over symbolic kernel sizes:
    "ValueError: Exponent must be non-negative.")."""
    shared = shared_dims(inputs, shapes)
    for position, (value, dims) in enumerate(zip(inputs, shapes.dims, strict=True)):
        if isinstance(value, torch.Tensor):
            for axis in range(value.dim()):
                if axis not in dims:
                    torch._dynamo.mark_static(value, axis)
        for axis, dim in dims.items():
            if (position, axis) in shared:
                continue
            if shapes.mode == "auto":
                torch._dynamo.maybe_mark_dynamic(value, axis)
            else:
                low, high = dynamo_range(*size_range(dim))
                torch._dynamo.mark_dynamic(value, axis, min=low, max=high)
    return bool(shared)


def shared_dims(inputs: Sequence[Any], shapes: DynamicShapes) -> set[tuple[int, int]]:
    """The (input, dim) pairs to leave unmarked so that dynamo gives them one symbol, as the user's
    compile did: the plain dims (no scale, no offset) of each symbol that sizes more than one dim.

    A dim dynamo is told about (`mark_dynamic`, `maybe_mark_dynamic`) always gets a symbol of its
    own; only an unmarked dim under `assume_static_by_default=False` is duck-sized, given the
    symbol of an equal size seen before, which is how `torch.compile(dynamic=True)` shared one
    symbol between two equal dims. Two shared symbols of equal sizes would merge into one, so such
    symbols are marked as before (each dim its own symbol) and logged."""
    groups: dict[str, list[tuple[int, int]]] = {}
    for position, dims in enumerate(shapes.dims):
        for axis, dim in dims.items():
            if dim.get("scale", 1) == 1 and dim.get("offset", 0) == 0 and "expr" not in dim:
                groups.setdefault(dim["name"], []).append((position, axis))
    sizes: dict[str, int] = {}
    for name, members in groups.items():
        values = {int(inputs[position].shape[axis]) for position, axis in members
                  if isinstance(inputs[position], torch.Tensor)}
        if len(members) > 1 and len(values) == 1:
            sizes[name] = values.pop()
    clashing = {name for name, size in sizes.items() if list(sizes.values()).count(size) > 1}
    if clashing:
        logger.info("symbols %s have equal sizes: duck sizing would merge them, each dim "
                    "gets a symbol of its own", sorted(clashing))
    return {member for name in sizes if name not in clashing for member in groups[name]}


def dynamo_range(low: int | None, high: int | None) -> tuple[int | None, int | None]:
    """`mark_dynamic`'s min and max: both or neither. torch 2.13 fails the compile on one alone
    ("not simple sympy type NoneType"), as a dim of `Dim("n", min=2)` has: the missing end becomes
    0 or the largest size dynamo bounds a dim by."""
    if (low is None) == (high is None):
        return low, high
    return (0 if low is None else low), (sys.maxsize - 1 if high is None else high)


def export_dynamic_shapes(shapes: DynamicShapes | None) -> list[dict[int, Any] | None] | None:
    """`torch.export.export`'s `dynamic_shapes` for positional inputs: one `Dim` per symbol (dims
    of one symbol share it, `scale * Dim + offset` for derived ones), or `Dim.AUTO` for `auto`."""
    from torch.export import Dim

    if shapes is None:
        return None
    roots: dict[str, Any] = {}
    result: list[dict[int, Any] | None] = []
    for dims in shapes.dims:
        entry: dict[int, Any] = {}
        for axis, dim in dims.items():
            if shapes.mode == "auto":
                entry[axis] = Dim.AUTO
                continue
            bounds = {key: dim[key] for key in ("min", "max") if dim.get(key) is not None}
            root = roots.setdefault(dim["name"], Dim(dim["name"], **bounds))
            scale, offset = dim.get("scale", 1), dim.get("offset", 0)
            entry[axis] = root if (scale, offset) == (1, 0) else root * scale + offset
        result.append(entry or None)
    return result


def _through_dynamo(backend: Backend, shapes: DynamicShapes) -> Backend:
    """`backend` as dynamo calls it for a dynamic compile. Dynamo compiles at the first call, so
    compiling means one call on the (cloned) example inputs: an error the backend raised, or one
    dynamo raised before the backend returned, is a compile error; an error of the compiled program
    in that call is raised again when the result is run (a runtime error)."""

    def compile_symbolic(gm: fx.GraphModule, inputs: list[Any]) -> Compiled:
        attempt: dict[str, Any] = {}

        def traced(graph: fx.GraphModule, example_inputs: list[Any]) -> Compiled:
            try:
                compiled = backend(graph, list(example_inputs))
            except Exception as error:
                attempt["error"] = error
                raise
            attempt["compiled"] = True
            return compiled

        # gm.forward, not gm: GraphModule.__call__ formats a raised error's traceback with a
        # generator, which dynamo would try to trace (fullgraph: "Attempt to trace generator").
        optimized = torch.compile(gm.forward, backend=traced, fullgraph=True)

        def run(*args: Any) -> Any:
            if not mark_dynamic(args, shapes):
                return optimized(*args)
            import torch.fx.experimental._config as shapes_config

            # Duck sizing on whatever the default (a torch may turn it off): only the shared dims use it.
            with torch._dynamo.config.patch(assume_static_by_default=False), shapes_config.patch(use_duck_shape=True):
                return optimized(*args)

        try:
            run(*inputs)
        except Exception as error:
            failure = error
        else:
            return run
        if "error" in attempt:
            raise attempt["error"]  # the backend's own error (not dynamo's wrapper), as a static compile raises it
        if "compiled" not in attempt:
            raise failure

        def fail(*args: Any) -> Any:
            raise failure

        return fail

    return compile_symbolic


def run_compiled(compiled: Compiled, inputs: list[Any]) -> Any:
    return _call(compiled, inputs)


def apply_inductor_config(overrides: dict[str, Any]) -> None:
    """Set each dotted config key: `cpp.inject_relu_bug_TESTING_ONLY` in `torch._inductor.config`,
    `torch._dynamo.config.X` and `torch._functorch.config.X` in theirs (as captures record them:
    `minify_contract.config_keys`)."""
    for key, value in overrides.items():
        module_name, setting = config_setting(key)
        owner: Any = importlib.import_module(module_name)
        *path, leaf = setting.split(".")
        try:
            for part in path:
                owner = getattr(owner, part)
            getattr(owner, leaf)
        except AttributeError:
            raise BackendError(f"unknown {module_name} key {key!r}") from None
        try:
            setattr(owner, leaf, value)
        except Exception as error:
            raise BackendError(f"cannot set {module_name}.{setting} = {value!r}: {error}") from error
