"""repro.py: the standalone script (plain torch, no minify import) that compiles and runs the
minimized graph as the worker does. `render_repro` is pure: a graph, a JobSpec and (optionally)
the inputs in, the script's text out; `artifacts.write_program_files` writes it beside inputs.pt and
signature_rules.py.

It reads top to bottom as the bug: a short header, the settings, the minimal program, its inputs,
the call. Inputs small enough to read (`inline_inputs`: a few elements, each exactly written,
plainly laid out) are written into it, so that it fits in an issue; others are read from
inputs.pt, which keeps exact bits, strides and scalar types. minify's signature rules (how the
failure is named, for the 'repro failed with:' line the version checks read) are not in it but
beside it, in signature_rules.py, which it uses where it finds it.
"""

from __future__ import annotations

import inspect
import json
import math
import re
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx

from minify_contract import accuracy, signatures, zero_tensors
from minify_contract.config_keys import INDUCTOR_CONFIG, config_setting
from minify_contract.models import BUILTIN_BACKENDS, JobSpec
from minify_worker.engine.artifacts import SIGNATURE_RULES_MODULE, WATCH_FOR_THE_HANG, hang_notes, header_tail
from minify_worker.outcomes import Signature
from minify_worker.programs.fx.backends import (
    DynamicShapes,
    constant_positions,
    dynamic_shapes_of,
    loop_carries_a_number,
)
from minify_worker.programs.fx.graph import holds_autograd_functions, subgraph_of, subgraphs, to_graph_module


def render_repro(graph: fx.Graph, spec: JobSpec, signature: Signature | None, torch_version: str,
                 environment: Mapping[str, str] | None = None, culprit_lines: list[str] | None = None,
                 inputs: Sequence[Any] | None = None, eager_error: str | None = None,
                 hang_bound_s: float | None = None) -> str:
    """A standalone script (plain torch) that compiles and runs `graph` as the worker does.

    `python repro.py` exits non-zero with the failure's exception on stderr (or dies by the
    crash's signal) while the bug is there, and 0 once it is fixed. The failure kind is the
    signature's (what was observed) when there is one, else the spec's. With `inputs` (the
    graph's input values, in order) that `inline_inputs` can write, a straight script that holds
    them (`_render_inline`); else one that reads inputs.pt and whose header lists `environment`
    (the worker's, as `torch.utils.collect_env` reports it), ready for a bug report.

    `eager_error` (a crash whose program raises eagerly: `Type: message`): the header says so, and
    the script passes (exit 0) where the compiled program raises instead of dying, as eager does.

    `hang_bound_s` (a hang: the longest the job saw the result still compiling or running): the
    script holds compiling and running to it (`WATCH_FOR_THE_HANG`): past it, the hang reproduces,
    and the script says so, prints every thread's stack and exits 124; within it, it passes.
    """
    kind = signature.kind if signature is not None else spec.failure.kind
    bound_s = hang_bound_s if kind == "timeout" else None
    eager_error = eager_error if kind == "crash" else None
    shapes = dynamic_shapes_of(graph, spec.dynamic)
    plain = shapes is None and not subgraphs(graph) and spec.backend != "aot_inductor"
    # An inline repro copies its inputs with torch's clone_inputs (accuracy) and moves them with `to`
    # (CUDA), which would make a ZeroTensor dense: such inputs are read from inputs.pt, whose repro
    # builds them on the device and keeps them (_LOAD_ZERO_TENSORS, _KEEP_INPUTS).
    special = _kept_by_copies(inputs) and (kind == "accuracy" or torch.device(spec.device).type != "cpu")
    inline = inline_inputs(inputs) if inputs is not None and plain and not special else None
    if inline is not None:
        return _render_inline(graph, spec, kind, signature, torch_version, culprit_lines or [], inline, eager_error,
                              bound_s)
    constants = constant_positions(graph)
    if shapes is not None and constants:  # the compiled module takes the other inputs: their dims
        shapes = DynamicShapes(shapes.mode, tuple(dims for position, dims in enumerate(shapes.dims)
                                                  if position not in constants))
    classes, imports = _module_classes(graph, "Repro")
    cuda = torch.device(spec.device).type == "cuda"
    preamble = [
        _header(spec, kind, signature, torch_version, environment or {}, culprit_lines or [], eager_error, bound_s),
        _IMPORTS.replace("import copy\n", "import copy\nimport faulthandler\n") if kind == "crash" else _IMPORTS,
        *_op_module_imports(spec.op_modules),
        *([imports] if imports else []),
        *([_CRASH_STACK] if kind == "crash" else []),
        _config_lines(spec.config),
        *_autocast_lines(spec),
        _constants(spec, kind, signature, bound_s),
        *_constant_inputs(graph),
        *_dynamic_constants(shapes),
    ]
    definitions = [
        *classes,
        _trace_function(graph),
        *([_CONSTANTS_AS_ATTRIBUTES] if constants else []),
        *_compile_functions(spec.backend, shapes, _training(spec, kind)),
        *([_LOAD_ZERO_TENSORS] if inputs is not None and zero_tensors.contains(list(inputs)) else [_LOAD_INPUTS]),
        *([_KEEP_INPUTS] if _kept_by_copies(inputs) else []),
        *([_SYNCHRONIZE] if cuda else []),
        *([_CHECK_ACCURACY] if kind == "accuracy" else []),
        *([_FOR_TRAINING] if _training(spec, kind) else []),
        *([WATCH_FOR_THE_HANG] if bound_s else []),
        _main(kind, cuda, bool(constants), eager_error is not None, _training(spec, kind), spec.autocast is not None,
              bool(bound_s)),
    ]
    text = "\n\n".join(part.strip("\n") for part in preamble)
    return text + "\n\n\n" + "\n\n\n".join(part.strip("\n") for part in definitions) + "\n"


def _render_inline(graph: fx.Graph, spec: JobSpec, kind: str, signature: Signature | None, torch_version: str,
                   culprit_lines: list[str], inline: str, eager_error: str | None = None,
                   bound_s: float | None = None) -> str:
    """The repro of a plain graph (no subgraph, static shapes, not AOTInductor) with small inputs, as
    a script without functions: its settings, the program, its inputs, the call."""
    expected = str(signature) if signature is not None else "(not recorded)"
    cuda = torch.device(spec.device).type == "cuda"
    classes, imports = _module_classes(graph, "Repro")
    accuracy = kind == "accuracy"
    # The compiled program runs on copies where the reference runs after it (accuracy): a program
    # that writes into its inputs must not hand the reference inputs it changed.
    training = _training(spec, kind)
    compiler_import, compiled = _inline_compile(spec.backend, "*compiled_inputs" if accuracy else
                                                "*copies" if training else "*inputs", training)
    if accuracy:  # the copies the compiled program ran on: what it wrote into them is judged too
        compiled = ["compiled_inputs = clone_inputs(inputs)", *compiled]
    elif training:  # compiled and run on copies, as the worker does: inputs requiring grad, and no leaves
        compiled = ["copies = [value.clone() if isinstance(value, torch.Tensor) else value for value in inputs]",
                    *compiled]
    constants = constant_positions(graph)
    header = [
        f"minify repro: {kind} ({_EXPECTATIONS[kind]})",
        f"with {spec.backend} on {spec.device}, minimized on torch {torch_version}.",
        f"Signature: {expected}",
        *hang_notes(bound_s),
        *_eager_notes(eager_error),
        *_backend_notes(spec),
    ]
    header += header_tail(culprit_lines, {}, "", "Run: python repro.py")
    lines = [
        "\n".join(f"# {line}".rstrip() for line in header),
        "\n".join([*(["import faulthandler", ""] if kind == "crash" else []),
                   "import torch", "import torch._inductor.config",
                   *(["import copy", "import sys", "from torch._dynamo.debug_utils import AccuracyError, cast_to_fp64",
                      "from torch._dynamo.utils import clone_inputs, same"] if accuracy else []),
                   *([compiler_import] if compiler_import else [])]),
        *_op_module_imports(spec.op_modules),
        *([imports] if imports else []),
        *([_CRASH_STACK] if kind == "crash" else []),
        *([_config_lines(spec.config)] if spec.config else []),
        *_autocast_lines(spec),
        *([f"TOLERANCE = {spec.failure.tolerance!r}\nSTRICT_ACCURACY = {spec.failure.strict_accuracy!r}\n"
           f"GRADIENTS = {_gradients(spec)!r}"] if accuracy else []),
    ]
    call = [
        f"inputs = [\n{inline}]",
        *([f"inputs = [value.to({spec.device!r}) if isinstance(value, torch.Tensor) else value for value in inputs]"]
          if cuda else []),
        *(["# compiled for training, as the failing compile was: floating-point inputs require grad",
           "inputs = [value.detach().requires_grad_(True) if isinstance(value, torch.Tensor) and "
           "value.is_floating_point() else value for value in inputs]"] if training else []),
        f"try:  # {SIGNATURE_RULES_MODULE}.py, beside this file from minify, names the failure as minify does",
        f"    __import__({SIGNATURE_RULES_MODULE!r}).install({expected!r})",
        "except ModuleNotFoundError:",
        "    pass",
        "gm = trace_repro(Repro())" if _input_free_ops(graph) else "gm = torch.fx.symbolic_trace(Repro())",
        *_constant_inputs(graph),
        *(["gm, inputs = constants_as_attributes(gm, inputs, CONSTANT_INPUTS)"] if constants else []),
        *(["AUTOCAST.__enter__()"] if spec.autocast is not None else []),
        *([f"HANG_BOUND_S = {bound_s!r}", "started = watch_for_the_hang()"] if bound_s else []),
        *(_raising_passes(compiled + (["torch.cuda.synchronize()"] if cuda else []), "")
          if eager_error is not None else compiled),
        *(["torch.cuda.synchronize()  # surface asynchronous errors here"] if cuda and eager_error is None else []),
        *(["check_accuracy(gm, inputs, result, compiled_inputs)"] if accuracy else []),
        *(["hang_over(started)"] if bound_s else []),
        f'print(f"repro passed: no failure ({spec.backend} on {spec.device}, torch {{torch.__version__}})")',
    ]
    definitions = [*(part.replace("        super().__init__()\n\n", "").replace(
        "    def __init__(self) -> None:\n", "") for part in classes),
        *([WATCH_FOR_THE_HANG] if bound_s else []),
        *([_TRACE_RECORDING] if _input_free_ops(graph) else []),
        *([_CONSTANTS_AS_ATTRIBUTES] if constants else []),
        *([_CHECK_ACCURACY] if accuracy else [])]
    text = "\n\n".join(part.strip("\n") for part in lines)
    return text + "\n\n\n" + "\n\n\n".join(part.strip("\n") for part in definitions) + "\n\n\n" + "\n".join(call) + "\n"


def _inline_compile(backend: str, arguments: str = "*inputs", training: bool = False) -> tuple[str | None, list[str]]:
    """The import and the lines that compile `gm` as the worker does and run it on `arguments`
    (`result`); `training`: with grad mode on (inductor; other backends run in the mode they find)."""
    # For training, compiled on the copies it runs on, as the worker compiles (see `_main`).
    examples = "copies" if training else "inputs"
    if backend == "inductor" and training:
        return "from torch._inductor.compile_fx import compile_fx", [
            f"result = compile_fx(gm, {examples})({arguments})"]
    if backend == "inductor":
        return "from torch._inductor.compile_fx import compile_fx", [
            "with torch.no_grad():", f"    result = compile_fx(gm, inputs)({arguments})"]
    if ":" in backend:
        module, attribute = backend.split(":")
        return f"from {module} import {attribute}", [f"result = {attribute}(gm, {examples})({arguments})"]
    return None, [f"result = torch._dynamo.lookup_backend({backend!r})(gm, {examples})({arguments})"]


# Inputs written into repro.py: at most this many elements in all, each exactly representable.
INLINE_ELEMENTS_MAX = 64
_INLINE_DTYPES = {torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
                  torch.int16, torch.int8, torch.uint8, torch.bool}


def inline_inputs(inputs: Sequence[Any]) -> str | None:
    """The inputs as Python expressions (`torch.tensor([...], dtype=...)`, scalars as literals; a
    ZeroTensor, which holds no elements, as `torch._efficientzerotensor(shape)`), one per line, or
    None where they are better read from inputs.pt: too many elements, or a dtype or a layout the
    literal would not keep (a view's strides or offset, a negative view's bit, a non-CPU tensor)."""
    if sum(zero_tensors.elements(value) for value in inputs if isinstance(value, torch.Tensor)) > INLINE_ELEMENTS_MAX:
        return None
    lines = []
    for value in inputs:
        if zero_tensors.is_zero_tensor(value):
            if value.device.type != "cpu" or not value.is_contiguous():
                return None
            lines.append(f"torch._efficientzerotensor({list(value.shape)}, dtype={value.dtype})")
        elif isinstance(value, torch.Tensor):
            if value.dtype not in _INLINE_DTYPES or value.device.type != "cpu" or value.requires_grad or \
                    not value.is_contiguous() or value.storage_offset() != 0 or value.layout != torch.strided \
                    or value.is_neg() or value.is_conj():
                return None
            lines.append(_tensor_literal(value))
        elif isinstance(value, (bool, int)) or (isinstance(value, float) and math.isfinite(value)):
            lines.append(repr(value))
        else:
            return None
    return "".join(f"    {line},\n" for line in lines)


def _tensor_literal(value: torch.Tensor) -> str:
    dtype = str(value.dtype)
    if value.numel() == 0:
        return f"torch.empty({list(value.shape)}, dtype={dtype})"
    if not value.is_floating_point():
        return f"torch.tensor({value.tolist()!r}, dtype={dtype})"
    flat = [_float_literal(number, value.dtype) for number in value.reshape(-1).tolist()]
    text = f"[{', '.join(flat)}]" if value.dim() else flat[0]
    reshape = f".reshape({list(value.shape)})" if value.dim() > 1 else ""
    return f"torch.tensor({text}, dtype={dtype}){reshape}"


def _float_literal(number: float, dtype: torch.dtype) -> str:
    """The shortest decimal that gives back `number` in `dtype` (nan and the infinities spelled out)."""
    if math.isnan(number):
        return "float('nan')"
    if math.isinf(number):
        return "float('inf')" if number > 0 else "float('-inf')"
    for digits in range(1, 18):
        text = f"{number:.{digits}g}"
        if torch.tensor(float(text), dtype=dtype).item() == number:
            return text if any(mark in text for mark in ".en") else f"{text}.0"
    return repr(number)


_MAX_HEADER_TEXT = 300

_EXPECTATIONS = {
    "compile_error": "raises while compiling",
    "runtime_error": "raises while running the compiled program",
    "accuracy": "the compiled program's outputs differ from eager (fp64 RMSE): AccuracyError",
    "crash": "the process dies by the signal (or exits with the status) below",
    "timeout": "compiling or running hangs",
    "oom": "compiling or running runs out of memory",
    "any": "fails",
}


def _header(spec: JobSpec, kind: str, signature: Signature | None, torch_version: str,
            environment: Mapping[str, str], culprit_lines: list[str] | None = None,
            eager_error: str | None = None, bound_s: float | None = None) -> str:
    failure = spec.failure
    lines = [
        "Minimized repro written by minify (plain torch; no minify import).",
        "",
        f"Expected failure: {kind} ({_EXPECTATIONS[kind]})",
        f"Signature:        {signature if signature is not None else '(not recorded)'}",
        f"Backend:          {spec.backend}",
        f"Device:           {spec.device}",
        f"Minimized with:   torch {torch_version}",
        f"Config overrides: {json.dumps(spec.config, sort_keys=True) if spec.config else '(none)'}",
    ]
    observed = signature.text.strip().splitlines()[0][:_MAX_HEADER_TEXT] if signature and signature.text else ""
    if observed and observed != str(signature):
        lines.append(f"As observed:      {observed}")
    if kind == "accuracy":
        floats = "every floating-point output" + (" (strict)" if failure.strict_accuracy else "")
        lines.append(f"Accuracy:         tolerance {failure.tolerance} for {floats}; integers and booleans exactly")
    lines += hang_notes(bound_s)
    lines += _eager_notes(eager_error)
    lines += _backend_notes(spec)
    lines += header_tail(culprit_lines, environment, "torch.utils.collect_env, on the worker",
                         "Run: python repro.py [--inputs PATH]     (inputs.pt beside this file by default)")
    return "\n".join(f"# {line}".rstrip() for line in "\n".join(lines).splitlines())


def _eager_notes(eager_error: str | None) -> list[str]:
    """A crash whose program raises eagerly: what eager raises, and what a fixed compiler does."""
    if eager_error is None:
        return []
    return [f"Eager raises:     {eager_error.splitlines()[0][:_MAX_HEADER_TEXT] if eager_error else ''}",
            "                  the compiled program kills the process instead; where it raises too (fixed),",
            "                  this script passes"]


def _raising_passes(lines: list[str], indent: str) -> list[str]:
    """`lines` (the compiled program's call) in a try: where they raise, as eager does, the script
    passes (a crash job whose program raises eagerly; the bug is the compiled program dying)."""
    return [f"{indent}try:  # eager raises here (see the header): the compiled program should raise too",
            *(f"{indent}    {line}" for line in lines),
            f"{indent}except Exception as error:",
            f'{indent}    print(f"repro passed: the compiled program raises as eager does: {{type(error).__name__}}: '
            f'{{error}}"[:2000])',
            f"{indent}    raise SystemExit(0) from None"]


def _backend_notes(spec: JobSpec) -> list[str]:
    """What a reader must have beside torch: the custom backend's module, the package that registers
    the backend, the modules that register the custom ops."""
    notes = []
    if ":" in spec.backend:
        module = spec.backend.split(":")[0]
        notes.append(f"Custom backend:   imported by path: {module} must be importable (PYTHONPATH)")
    elif spec.backend not in BUILTIN_BACKENDS:
        notes.append(f"Backend package:  the one that registers {spec.backend!r} with torch.compile must be "
                     "installed (torch._dynamo.list_backends())")
    if spec.op_modules:
        notes.append(f"Custom ops:       registered by importing {', '.join(spec.op_modules)}: must be importable "
                     "(PYTHONPATH)")
    return notes



# A crash's repro prints the Python stack it dies in (compiling, or running the compiled program)
# before the signal ends it, as minify's sandbox children do: the signal alone does not say which.
_CRASH_STACK = "faulthandler.enable()  # a crash prints the Python stack it died in"

_IMPORTS = """
import argparse
import copy
import sys
from pathlib import Path

import torch
import torch._inductor.config
from torch._dynamo.debug_utils import AccuracyError, cast_to_fp64
from torch._dynamo.utils import clone_inputs, same

try:  # minify's copies keep inputs that share a storage views of one copy, as the failing run had them
    from accuracy_rules import clone_inputs
except ImportError:
    pass
"""


def _op_module_imports(modules: Sequence[str]) -> list[str]:
    """The imports that register the custom ops the graph calls (the spec's `op_modules`), before
    anything traces or loads it."""
    if not modules:
        return []
    return ["\n".join(["# the modules that register the graph's custom ops (job spec op_modules)",
                       *(f"import {module}" for module in modules)])]


_REPRO_CLASS = """
class {name}(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__(){submodules}

{forward}
"""

_TRACE_SYMBOLIC = """
def trace_repro(module, inputs):
    \"\"\"The module as an fx.GraphModule, the graph minify tested.\"\"\"
    return torch.fx.symbolic_trace(module)
"""

# Plain symbolic_trace runs an op none of whose arguments is an input while it traces, and puts
# the result in the graph as a constant tensor; this tracer keeps every op an op.
_TRACE_RECORDING = '''
def trace_repro(module, inputs=None):
    """The module as an fx.GraphModule, node for node the graph minify tested. Plain symbolic_trace
    would run an op that takes no input (a factory: randperm, arange, full) once, while tracing, and
    put its result in the graph as a constant: another program, which the compiler may not fail on
    (a pattern of the op is gone, a random op's values are fixed). Every op is recorded here."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_leaves

    tracer = torch.fx.Tracer()

    def is_op(func):
        name = getattr(func, "__name__", "")
        return isinstance(func, torch._ops.OpOverload) or getattr(torch._C._VariableFunctions, name, None) is func

    class RecordEveryOp(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if is_op(func) and not any(isinstance(leaf, torch.fx.Proxy) for leaf in tree_leaves((args, kwargs))):
                return tracer.create_proxy("call_function", func, args, kwargs)
            return func(*args, **kwargs)

    with RecordEveryOp():
        graph = tracer.trace(module)
    return torch.fx.GraphModule(tracer.root, graph, type(module).__name__)
'''

_CONSTANTS_AS_ATTRIBUTES = '''
def constants_as_attributes(gm, inputs, positions):
    """`gm` with its inputs at `positions` made tensor attributes of the module (get_attr nodes), and
    the inputs it then takes. They are the program's constant tensors (built from literals, as
    `torch.tensor([...])`): torch.compile hands a compiler such a tensor as a constant in the graph,
    which it may fold into its kernels, and compiled as an input it is another program."""
    import copy
    import warnings

    module = copy.deepcopy(gm)
    placeholders = [node for node in module.graph.nodes if node.op == "placeholder"]
    body = next(node for node in module.graph.nodes if node.op != "placeholder")
    kept = []
    for position, (node, value) in enumerate(zip(placeholders, inputs)):
        if position not in positions or not isinstance(value, torch.Tensor):
            kept.append(value)
            continue
        setattr(module, node.name, value.detach().clone())  # a plain attribute, as torch.compile's constants
        with module.graph.inserting_before(body), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # FX warns of any attribute but a buffer or parameter
            attribute = module.graph.get_attr(node.name)
        node.replace_all_uses_with(attribute)
        module.graph.erase_node(node)
    module.recompile()
    return module, kept
'''

# symbolic_trace cannot trace a higher-order op (cond checks its operands are tensors); make_fx
# runs the module on the inputs and records the same aten ops and subgraphs.
_TRACE_MAKE_FX = """
def trace_repro(module, inputs):
    \"\"\"The module as an fx.GraphModule, the graph minify tested, its subgraphs as submodules.\"\"\"
    from torch.fx.experimental.proxy_tensor import make_fx

    with torch.no_grad():
        return make_fx(module)(*clone_inputs(inputs))
"""

# make_fx cannot trace a while_loop that carries a number outside dynamo (the carry becomes an
# unbacked symbol, `cond_fn must return a boolean ... but got u0 < 3`); such a graph compiles under
# torch.compile (`backends.data_dependent`), which traces the module as written, as the worker's does.
_TRACE_AS_WRITTEN = """
def trace_repro(module, inputs):
    \"\"\"The module as written: torch.compile traces it (its while_loop carries a number, which
    only dynamo's ShapeEnv can hold while tracing).\"\"\"
    return module
"""

# make_fx traces through a custom autograd.Function (`autograd_function_apply`) and keeps its forward
# only, and through an autocast region (`wrap_with_autocast`), whose casts it writes into the graph;
# the higher-order ops run their subgraphs with torch.fx.Interpreter, so they become fx.GraphModules
# and the module is compiled as written, as the worker compiles it.
_TRACE_KEEPING_FUNCTIONS = """
def trace_repro(module, inputs):
    \"\"\"The module as written, its subgraphs (a custom autograd.Function's forward and backward,
    an autocast region's body) as fx.GraphModules: tracing it would run through them.\"\"\"
    for name, child in list(module.named_children()):
        setattr(module, name, torch.fx.symbolic_trace(child))
    return module
"""

_COMPILE_HEAD = '''
def {name}(gm, inputs):
    """Compile `gm` as the minify worker does ({how}).

    Returns a function of *inputs: what a torch.compile backend returns, called as dynamo calls it.
    """
'''

_COMPILE_HOW = {
    "inductor": "compile_fx under no_grad",
    "aot_inductor": "export, aoti_compile_and_package, aoti_load_package, under no_grad",
    "aot_eager": "torch's aot_eager backend",
    "eager": "torch's eager backend",
}

_COMPILE_BODIES = {
    "inductor": """
    from torch._inductor.compile_fx import compile_fx

    with torch.no_grad():
        compiled = compile_fx(gm, inputs)

    def run(*args):
        with torch.no_grad():
            return compiled(*args)

    return run
""",
    "aot_inductor": """
    with torch.no_grad():
        program = torch.export.export(gm, tuple(inputs){dynamic_shapes})
        package_path = torch._inductor.aoti_compile_and_package(program)
        compiled = torch._inductor.aoti_load_package(package_path)

    def run(*args):
        with torch.no_grad():
            return compiled(*args)

    return run
""",
    "registered": """
    return torch._dynamo.lookup_backend({backend!r})(gm, inputs)
""",
    "custom": """
    import importlib

    backend = getattr(importlib.import_module({module!r}), {attribute!r})
    return backend(gm, inputs)
""",
}

_LOAD_INPUTS = """
def load_inputs(path):
    inputs = torch.load(path, weights_only=True)
    return [value.to(DEVICE) if isinstance(value, torch.Tensor) else value for value in inputs]
"""

# inputs.pt holds a ZeroTensor as a marker (minify_contract.zero_tensors: torch.save cannot write
# one): this loader rebuilds it.
_LOAD_ZERO_TENSORS = '''
def load_inputs(path):
    inputs = torch.load(path, weights_only=True)
    return [zero_tensor(value) if isinstance(value, dict)  # the only dicts are ZeroTensors' markers
            else value.to(DEVICE) if isinstance(value, torch.Tensor) else value for value in inputs]


def zero_tensor(marker):
    """A ZeroTensor input (a tensor without storage, as autograd gives the zero gradient of sgn):
    inputs.pt holds its shape, strides and dtype, since torch.save cannot write it."""
    zeros = torch._efficientzerotensor(marker["shape"], dtype=getattr(torch, marker["dtype"]), device=DEVICE)
    return zeros if list(zeros.stride()) == marker["stride"] else zeros.as_strided(marker["shape"], marker["stride"])
'''

# Inputs a clone would change (minify_contract.accuracy.clone_input): the copies the compiled program
# runs on keep what each input is.
_KEEP_INPUTS = '''
_clone_inputs = clone_inputs


def clone_inputs(inputs):
    """Copies of `inputs`, each what the program received: clone() makes a ZeroTensor dense and
    resolves a conjugate or negative view's bit, another input for the compiled code."""
    copies = list(_clone_inputs(inputs))
    for position, value in enumerate(inputs):
        if not isinstance(value, torch.Tensor):
            continue
        if value._is_zerotensor():  # immutable: its own copy
            copies[position] = value
            continue
        if value.is_neg():
            copies[position] = torch._neg_view(copies[position].neg())
        if value.is_conj():
            copies[position] = copies[position].conj_physical().conj()
    return copies
'''


def _kept_by_copies(inputs: Sequence[Any] | None) -> bool:
    """Whether `inputs` hold a tensor a clone would change (a ZeroTensor, a conjugate or negative view)."""
    return inputs is not None and any(isinstance(value, torch.Tensor) and (
        value._is_zerotensor() or value.is_conj() or value.is_neg()) for value in inputs)


_SYNCHRONIZE = """
def synchronize():
    torch.cuda.synchronize()  # surface asynchronous errors and crashes here
"""

_CHECK_ACCURACY = '''
def check_accuracy(gm, inputs, result, compiled_inputs=None):
    """minify's accuracy rule: compared with eager, floats judged against an fp64 reference as
    torch's accuracy minifier judges them, integers and booleans exactly, ties told apart, then the
    inputs the program wrote into (`compiled_inputs`, the copies the compiled program ran on)
    against what eager wrote (accuracy_rules.py, beside this file from minify); without that file,
    torch's rule for floats and every integer and boolean output exactly equal."""
    eager_inputs = clone_inputs(inputs)
    try:
        reference = copy.deepcopy(gm)(*eager_inputs)
    except Exception as error:  # eager raises where the compiled program returned: minify's MissingError
        from accuracy_rules import missing_error

        raise missing_error(error) from None
    fp64_reference = None
    if torch._dynamo.config.same_two_models_use_fp64:
        try:  # minify's cast (accuracy_rules.py): every subgraph too, without export's dtype asserts
            from accuracy_rules import fp64_copy
        except ImportError:
            fp64_copy = cast_to_fp64
        try:
            fp64_gm, fp64_inputs = fp64_copy(gm, clone_inputs(inputs))
            fp64_reference = fp64_gm(*fp64_inputs)
        except Exception:
            if not STRICT_ACCURACY:  # non-strict accuracy cannot be judged without fp64
                print("cannot compute the fp64 reference this accuracy check needs", file=sys.stderr)
                raise
    try:
        from accuracy_rules import divergence
    except ImportError:
        from torch.utils._pytree import tree_leaves

        integers = [(a, b) for a, b in zip(tree_leaves(reference), tree_leaves(result))
                    if isinstance(a, torch.Tensor) and not (a.is_floating_point() or a.is_complex())]
        if not same(reference, result, fp64_reference, tol=TOLERANCE, equal_nan=True,
                    ignore_non_fp=not STRICT_ACCURACY) or not all(torch.equal(a, b) for a, b in integers):
            raise AccuracyError("Bad accuracy detected") from None
        return
    detail = divergence(reference, result, fp64_reference, tolerance=TOLERANCE, strict=STRICT_ACCURACY, gm=gm,
                        inputs=inputs)
    if detail is None and compiled_inputs is not None:
        from accuracy_rules import written_inputs

        detail = written_inputs(inputs, eager_inputs, compiled_inputs, tolerance=TOLERANCE)
    if detail is None:
        from accuracy_rules import merged_outputs

        detail = merged_outputs(reference, result)
    if detail is not None:
        raise AccuracyError(detail)
    if GRADIENTS:  # a training step's gradients, compiled for training by the backend GRADIENTS names
        from accuracy_rules import check_gradients

        check_gradients(gm, inputs, GRADIENTS, tolerance=TOLERANCE, strict=STRICT_ACCURACY)
'''

# The module beside an accuracy repro.py that holds minify's accuracy rule
# (minify_worker.engine.artifacts.ACCURACY_RULES).


def accuracy_rules_module() -> str:
    """accuracy_rules.py: minify_contract/accuracy.py verbatim (standard library and torch only)."""
    return inspect.getsource(accuracy)


# The module beside repro.py that names a failure as minify records it (minify_worker.engine.artifacts.SIGNATURE_RULES).


def _main(kind: str, cuda: bool, constants: bool = False, eager_raises: bool = False, training: bool = False,
          autocast: bool = False, hang_bound: bool = False) -> str:
    head = ["def main():",
            '    parser = argparse.ArgumentParser(description="Run the minimized repro.")',
            '    parser.add_argument("--inputs", type=Path, '
            'default=Path(__file__).resolve().with_name("inputs.pt"))',
            "    inputs = load_inputs(parser.parse_args().inputs)",
            *(["    inputs = for_training(inputs)"] if training else [])]
    # An accuracy repro keeps the copies the compiled program ran on: what it wrote into them is judged.
    arguments = "compiled_inputs" if kind == "accuracy" else "clone_inputs(inputs)"
    body = ["    gm = trace_repro(Repro(), inputs)",
            *(["    gm, inputs = constants_as_attributes(gm, inputs, CONSTANT_INPUTS)"] if constants else []),
            *(["    AUTOCAST.__enter__()"] if autocast else []),
            *(["    started = watch_for_the_hang()"] if hang_bound else []),
            # For training, compiled on copies, as the worker compiles: an input requiring grad is then
            # no leaf, which AOT autograd's functionalization may write back into (torch 2.11 refuses
            # a leaf there, where the worker's run failed in the partitioner).
            "    compiled = compile_repro(gm, clone_inputs(inputs))" if training else
            "    compiled = compile_repro(gm, list(inputs))",
            *(["    compiled_inputs = clone_inputs(inputs)"] if kind == "accuracy" else []),
            *(_raising_passes([f"result = compiled(*{arguments})", *(["synchronize()"] if cuda else [])],
                              "    ") if eager_raises else
              [f"    result = compiled(*{arguments})", *(["    synchronize()"] if cuda else [])]),
            *(["    check_accuracy(gm, inputs, result, compiled_inputs)"] if kind == "accuracy" else []),
            *(["    hang_over(started)"] if hang_bound else []),
            '    print(f"repro passed: no failure ({BACKEND} on {DEVICE}, torch {torch.__version__})")']
    tail = ["", "",
            'if __name__ == "__main__":',
            f"    try:  # {SIGNATURE_RULES_MODULE}.py beside this file (from minify) names the failure as minify does",
            f"        import {SIGNATURE_RULES_MODULE}",
            "    except ImportError:",
            "        pass",
            "    else:",
            f"        {SIGNATURE_RULES_MODULE}.install(EXPECTED_SIGNATURE)",
            "    main()"]
    return "\n".join([*head, *body, *tail])


def signature_rules_module() -> str:
    """signature_rules.py: minify_contract/signatures.py verbatim, and the excepthook repro.py installs
    with it: after the traceback, the exception chain and a 'repro failed with:' line in the form
    report.json records (what the version checks read), then the signature expected."""
    source = inspect.getsource(signatures).replace("from __future__ import annotations\n", "")
    return source.rstrip("\n") + "\n\n" + _INSTALL_EXCEPTHOOK


_INSTALL_EXCEPTHOOK = '''
def install(expected_signature):
    """After a failure's traceback, print its exception chain and its signature as minify records it."""
    import sys

    def explain_failure(exc_type, error, traceback):
        sys.__excepthook__(exc_type, error, traceback)
        print(file=sys.stderr)
        chain = exception_chain(error)
        if len(chain) > 1:
            print("exception chain:   " + "\\n                   <- ".join(describe_chain(chain)), file=sys.stderr)
        # An accuracy failure's signature is its type alone, as minify records it.
        wrong_values = exc_type.__name__ in ("AccuracyError", "GradientError")
        observed = wrong_values_signature(error) if wrong_values else signature_line(error)
        print(f"repro failed with: {observed}", file=sys.stderr)
        print(f"minify expected:   {expected_signature}", file=sys.stderr)

    sys.excepthook = explain_failure


def wrong_values_signature(error):
    """Wrong values as minify signs them: by the exception's type, an AccuracyError keyed as minify
    keys the failures only integer outputs, written inputs or merged outputs show (accuracy_rules'
    detail_key: 'integer outputs only', 'written inputs only', 'outputs merged'). Without
    accuracy_rules.py, torch's own check said nothing to key."""
    name = type(error).__name__
    try:
        from accuracy_rules import detail_key
    except ImportError:
        return name
    key = detail_key(str(error)) if name == "AccuracyError" else ""
    return f"{name}: {key}" if key else name
'''


def _compile_functions(backend: str, shapes: DynamicShapes | None, training: bool = False) -> list[str]:
    """`compile_repro`; with dynamic dims, what keeps them symbolic as the worker does: aot_inductor
    exports with them, any other backend (then `backend_repro`) runs under torch.compile with them
    marked (`minify_worker.programs.fx.backends`). `training`: inductor compiles with grad mode on."""
    symbolic = shapes is not None and backend != "aot_inductor"
    if backend == "inductor" and training:
        body = _COMPILE_BODIES[backend].replace("torch.no_grad()", "torch.enable_grad()")
    elif backend == "inductor":
        body = _COMPILE_BODIES[backend]
    elif backend == "aot_inductor":
        body = _COMPILE_BODIES[backend].replace(
            "{dynamic_shapes}", ", dynamic_shapes=export_dynamic_shapes()" if shapes is not None else "")
    elif ":" not in backend:
        body = _COMPILE_BODIES["registered"].format(backend=backend)
    else:
        module, attribute = backend.split(":")
        body = _COMPILE_BODIES["custom"].format(module=module, attribute=attribute)
    how = _COMPILE_HOW.get(backend, f"the torch.compile backend {backend}")
    if training:
        how = ("compile_fx with grad mode on" if backend == "inductor" else how) + \
            ", for training: inputs requiring grad, so AOT autograd traces the backward"
    head = _COMPILE_HEAD.format(name="backend_repro" if symbolic else "compile_repro", how=how)
    functions = [head.strip("\n") + "\n" + body.strip("\n")]
    if shapes is not None:
        functions.append(_DYNAMIC_FUNCTIONS["mark" if symbolic else "export"])
    return functions


def _dynamic_constants(shapes: DynamicShapes | None) -> list[str]:
    if shapes is None:
        return []
    dims = ",\n".join(f"    {dims!r}" for dims in shapes.dims)
    data_dependent = [] if any(shapes.dims) else [
        "# No dim is dynamic, but the graph reads sizes or scalars from data (nonzero, .item()): it",
        "# compiles under torch.compile, every dim static, for the ShapeEnv dynamo gives such a graph.",
    ]
    return ["\n".join([
        *data_dependent,
        "# The dims the program keeps dynamic, per input: {dim: {name, min, max[, scale, offset]}}; a",
        "# dim's size is scale * name + offset, name in [min, max] (None: unbounded). DYNAMIC says how:",
        "# as_exported (with these ranges) or auto (as torch.compile's automatic dynamic). Dims of one",
        "# name share one symbol.",
        f"DYNAMIC = {shapes.mode!r}",
        f"DYNAMIC_DIMS = [\n{dims},\n]",
    ])]


_DYNAMIC_FUNCTIONS = {
    "mark": '''
def mark_dynamic(inputs):
    """Mark DYNAMIC_DIMS on the inputs for dynamo: with their range, or (auto) as automatic dynamic
    marks a dim it saw change; every other dim static, as the program has it, whatever dynamo's
    config assumes (assume_static_by_default=False would make a weight's dims symbolic too).
    The dims of a symbol that sizes several dims stay unmarked, to share one symbol (dynamo's duck
    sizing, as torch.compile(dynamic=True) gave them): True when there are such dims."""
    shared = shared_dims(inputs)
    for position, (value, dims) in enumerate(zip(inputs, DYNAMIC_DIMS)):
        if isinstance(value, torch.Tensor):
            for dim in range(value.dim()):
                if dim not in dims:
                    torch._dynamo.mark_static(value, dim)
        for dim, spec in dims.items():
            if (position, dim) in shared:
                continue
            if DYNAMIC == "auto":
                torch._dynamo.maybe_mark_dynamic(value, dim)
                continue
            scale, offset = spec.get("scale", 1), spec.get("offset", 0)
            low = None if spec["min"] is None else scale * spec["min"] + offset
            high = None if spec["max"] is None else scale * spec["max"] + offset
            if (low is None) != (high is None):  # torch takes both ends or neither
                low, high = (0 if low is None else low), (sys.maxsize - 1 if high is None else high)
            torch._dynamo.mark_dynamic(value, dim, min=low, max=high)
    return bool(shared)


def shared_dims(inputs):
    """The (input, dim) pairs of each symbol that sizes several plain dims (a marked dim always gets
    a symbol of its own); not those of two such symbols with equal sizes, which would merge."""
    groups, sizes = {}, {}
    for position, dims in enumerate(DYNAMIC_DIMS):
        for dim, spec in dims.items():
            if spec.get("scale", 1) == 1 and spec.get("offset", 0) == 0 and "expr" not in spec:
                groups.setdefault(spec["name"], []).append((position, dim))
    for name, members in groups.items():
        values = {int(inputs[position].shape[dim]) for position, dim in members}
        if len(members) > 1 and len(values) == 1:
            sizes[name] = values.pop()
    kept = [name for name, size in sizes.items() if list(sizes.values()).count(size) == 1]
    return {member for name in kept for member in groups[name]}


def compile_repro(gm, inputs):
    """Compile `gm` with its dynamic dims symbolic, as the minify worker does: torch.compile with
    DYNAMIC_DIMS marked, so backend_repro receives them as SymInts, as dynamo gives them.

    Returns a function of *inputs; dynamo compiles at its first call.
    """
    # gm.forward, not gm: GraphModule.__call__ formats a raised error's traceback with a generator,
    # which dynamo would try to trace ("Attempt to trace generator") instead of raising the error.
    compiled = torch.compile(gm.forward, backend=backend_repro, fullgraph=True)

    def run(*args):
        if not mark_dynamic(args):
            return compiled(*args)
        with torch._dynamo.config.patch(assume_static_by_default=False), \
                torch.fx.experimental._config.patch(use_duck_shape=True):
            return compiled(*args)

    return run
''',
    "export": '''
def export_dynamic_shapes():
    """torch.export's dynamic_shapes for the inputs: a Dim per name (derived: scale * Dim + offset),
    or Dim.AUTO (auto)."""
    roots, shapes = {}, []
    for dims in DYNAMIC_DIMS:
        entry = {}
        for dim, spec in dims.items():
            if DYNAMIC == "auto":
                entry[dim] = torch.export.Dim.AUTO
                continue
            bounds = {key: spec[key] for key in ("min", "max") if spec.get(key) is not None}
            root = roots.setdefault(spec["name"], torch.export.Dim(spec["name"], **bounds))
            scale, offset = spec.get("scale", 1), spec.get("offset", 0)
            entry[dim] = root if (scale, offset) == (1, 0) else root * scale + offset
        shapes.append(entry or None)
    return shapes
''',
}


def _constants(spec: JobSpec, kind: str, signature: Signature | None, bound_s: float | None = None) -> str:
    return "\n".join([
        f"BACKEND = {spec.backend!r}",
        f"DEVICE = {spec.device!r}",
        f"FAILURE_KIND = {kind!r}",
        *([f"HANG_BOUND_S = {bound_s!r}"] if bound_s else []),
        *([f"TOLERANCE = {spec.failure.tolerance!r}", f"STRICT_ACCURACY = {spec.failure.strict_accuracy!r}",
           f"GRADIENTS = {_gradients(spec)!r}"] if kind == "accuracy" else []),
        f"EXPECTED_SIGNATURE = {str(signature) if signature is not None else '(not recorded)'!r}",
    ])


def _training(spec: JobSpec, kind: str) -> bool:
    """Whether the repro compiles for training (`FailureSpec.training`; an accuracy repro judges
    gradients by GRADIENTS instead)."""
    return spec.failure.training and kind != "accuracy"


_FOR_TRAINING = """
def for_training(inputs):
    \"\"\"The inputs as the failing training step passed them: floating-point tensors requiring grad.\"\"\"
    return [value.detach().requires_grad_(True) if isinstance(value, torch.Tensor) and value.is_floating_point()
            else value for value in inputs]
"""


def _gradients(spec: JobSpec) -> str | None:
    """The backend a gradient job's repro compiles for training with (`runner.judges_gradients`)."""
    from minify_worker.programs.fx.run import judges_gradients

    return spec.backend if judges_gradients(spec) else None


def _config_lines(config: dict[str, Any]) -> str:
    lines = ["# config overrides recorded in the job spec"]
    imports = set()
    for key, value in sorted(config.items()):
        if not all(part.isidentifier() for part in key.split(".")):
            raise ValueError(f"config key {key!r} is not a dotted config name")
        module, setting = config_setting(key)
        if module != INDUCTOR_CONFIG:  # _IMPORTS has inductor's
            imports.add(f"import {module}")
        lines.append(f"{module}.{setting} = {value!r}")
    return "\n".join([*sorted(imports), *lines]) if config else "# no config overrides"


def _autocast_lines(spec: JobSpec) -> list[str]:
    """The autocast region the failing program called the compiled function in (`spec.autocast`),
    entered once the program is traced (tracing inside it would write its casts into the graph),
    for the rest of the script: the compile, the compiled run and eager's, as the worker runs them;
    the accuracy rules take gradients outside it, as a training step does."""
    if spec.autocast is None:
        return []
    return ["# the failing program called the compiled function inside this autocast region: so does the repro,\n"
            "# from the compile on, once the program is traced (gradients are taken outside it, as a training\n"
            "# step takes them)\n"
            f"AUTOCAST = torch.autocast({spec.autocast.device!r}, dtype=torch.{spec.autocast.dtype})"]


# Names FX-generated code may use that _IMPORTS does not provide, and how to provide them.
_KNOWN_GLOBALS = {
    "device": "from torch import device",
    "inf": "from math import inf",
    "nan": "from math import nan",
    "NoneType": "NoneType = type(None)",
    "fx_pytree": "import torch.fx._pytree as fx_pytree",
    "pytree": "import torch.utils._pytree as pytree",
}


def _module_classes(graph: fx.Graph, name: str) -> tuple[list[str], str]:
    """The class `name` running `graph` and, before it, a class per subgraph (named after its path),
    installed in `__init__` under the name the forward reads; and the imports their code needs."""
    classes: list[str] = []
    imports: list[str] = []
    submodules = ""
    for node in subgraphs(graph):
        inner_classes, inner_imports = _module_classes(subgraph_of(node), f"{name}_{node.target}")
        classes += inner_classes
        imports += inner_imports.splitlines()
        submodules += f"\n        self.{node.target} = {name}_{node.target}()"
    forward, own_imports = _forward_source(graph)
    classes.append(_REPRO_CLASS.format(name=name, submodules=submodules,
                                       forward=textwrap.indent(forward, "    ")))
    imports += own_imports.splitlines()
    return classes, "\n".join(dict.fromkeys(imports))


def _trace_function(graph: fx.Graph) -> str:
    if subgraphs(graph):
        if holds_autograd_functions(graph) or _holds_autocast_regions(graph):
            return _TRACE_KEEPING_FUNCTIONS
        return _TRACE_AS_WRITTEN if loop_carries_a_number(graph) else _TRACE_MAKE_FX
    return _TRACE_RECORDING if _input_free_ops(graph) else _TRACE_SYMBOLIC


def _holds_autocast_regions(graph: fx.Graph) -> bool:
    """Whether `graph` holds an autocast region (`wrap_with_autocast`), which make_fx traces
    through, leaving its casts without the region (pytorch#179804's `autocast(enabled=False)`
    inside the program's bf16 region: the backward the compile builds for it is the bug)."""
    return any(node.op == "call_function" and getattr(node.target, "__name__", "") == "wrap_with_autocast"
               for node in graph.nodes)


def _input_free_ops(graph: fx.Graph) -> bool:
    """Whether `graph` calls an op none of whose arguments is a node (`randperm(8)`, `arange(0, 11)`),
    which plain symbolic_trace would run while tracing and bake in as a constant."""
    return any(node.op == "call_function" and not node.all_input_nodes for node in graph.nodes)


def _constant_inputs(graph: fx.Graph) -> list[str]:
    """`CONSTANT_INPUTS = [...]`, the positions of the program's constant tensors among the inputs,
    and what they are; nothing for a program without any."""
    positions = constant_positions(graph)
    if not positions:
        return []
    names = [node.name for node in graph.nodes if node.op == "placeholder"]
    return ["\n".join([
        f"# {', '.join(names[position] for position in positions)}: the program's constant tensors, built from",
        "# literals inside it; the compiler receives them as constants in the graph, as torch.compile gives them.",
        f"CONSTANT_INPUTS = {positions!r}",
    ])]


def _forward_source(graph: fx.Graph) -> tuple[str, str]:
    """`def forward(self, ...)` as FX prints it, and the imports its globals need."""
    module = to_graph_module(graph)
    code = module.graph.python_code(root_module="self")
    forward = textwrap.dedent(code.src).strip("\n").rstrip()
    imports = []
    for name, value in sorted(code.globals.items()):
        if name == "torch" or not re.search(rf"\b{re.escape(name)}\b", forward):
            continue
        imports.append(_KNOWN_GLOBALS.get(name) or _import_line(name, value))
    return forward, "\n".join(imports)


def _import_line(name: str, value: Any) -> str:
    if isinstance(value, type(torch)):
        return f"import {value.__name__} as {name}"
    module = getattr(value, "__module__", None)
    qualified = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    if not module or not qualified or "." in qualified or module == "builtins":
        raise ValueError(f"cannot write an import for {name!r} ({value!r}) in repro.py")
    return f"from {module} import {qualified}" + (f" as {name}" if name != qualified else "")
