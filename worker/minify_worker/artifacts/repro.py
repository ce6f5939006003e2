"""repro.py: the standalone script (plain torch, no minify import) that compiles and runs the
minimized graph as the worker does. `render_repro` is pure: a graph and a JobSpec in, the script's
text out; `files.write_program_files` writes it beside inputs.pt, which it always reads its inputs
from rather than embedding them (see the package's docstring).
"""

from __future__ import annotations

import inspect
import json
import re
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx

from minify_client import signatures
from minify_client.config_keys import INDUCTOR_CONFIG, config_setting
from minify_client.models import BUILTIN_BACKENDS, JobSpec

from ..backends import DynamicShapes, dynamic_shapes_of
from ..graph import subgraph_of, subgraphs, to_graph_module
from ..outcomes import Signature


def render_repro(graph: fx.Graph, spec: JobSpec, signature: Signature | None, torch_version: str,
                 environment: Mapping[str, str] | None = None, culprit_lines: list[str] | None = None) -> str:
    """A standalone script (plain torch) that compiles and runs `graph` as the worker does.

    `python repro.py` exits non-zero with the failure's exception on stderr (or dies by the
    crash's signal) while the bug is there, and 0 once it is fixed. The failure kind is the
    signature's (what was observed) when there is one, else the spec's. The header lists
    `environment` (the worker's, as `torch.utils.collect_env` reports it), ready for a bug report.
    """
    kind = signature.kind if signature is not None else spec.failure.kind
    shapes = dynamic_shapes_of(graph, spec.dynamic)
    classes, imports = _module_classes(graph, "Repro")
    preamble = [
        _header(spec, kind, signature, torch_version, environment or {}, culprit_lines or []),
        _IMPORTS,
        *_op_module_imports(spec.op_modules),
        *([imports] if imports else []),
        _config_lines(spec.config),
        _constants(spec, kind, signature),
        *_dynamic_constants(shapes),
    ]
    definitions = [
        *classes,
        _trace_function(graph),
        *_compile_functions(spec.backend, shapes),
        _signature_rules(),
        _RUN_FUNCTIONS,
    ]
    text = "\n\n".join(part.strip("\n") for part in preamble)
    return text + "\n\n\n" + "\n\n\n".join(part.strip("\n") for part in definitions) + "\n"


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
            environment: Mapping[str, str], culprit_lines: list[str] | None = None) -> str:
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
        compared = "every output (strict)" if failure.strict_accuracy else "floating-point outputs"
        lines.append(f"Accuracy:         tolerance {failure.tolerance}, {compared} compared")
    if ":" in spec.backend:
        module = spec.backend.split(":")[0]
        lines.append(f"Custom backend:   imported by path: {module} must be importable (PYTHONPATH)")
    elif spec.backend not in BUILTIN_BACKENDS:
        lines.append(f"Backend package:  the one that registers {spec.backend!r} with torch.compile must be "
                     "installed (torch._dynamo.list_backends())")
    if spec.op_modules:
        lines.append(f"Custom ops:       registered by importing {', '.join(spec.op_modules)}: must be importable "
                     "(PYTHONPATH)")
    lines += header_tail(culprit_lines, environment, "torch.utils.collect_env, on the worker",
                         "Run: python repro.py [--inputs PATH]     (inputs.pt beside this file by default)")
    return "\n".join(f"# {line}".rstrip() for line in "\n".join(lines).splitlines())


def header_tail(culprit_lines: list[str] | None, environment: Mapping[str, str] | None, environment_source: str,
                run_line: str) -> list[str]:
    """The end of a repro.py header, whatever the program: the culprit's lines, the environment it
    failed in, how to run it and what it prints."""
    lines: list[str] = []
    if culprit_lines:
        lines += ["", *culprit_lines]
    if environment:
        lines += ["", f"Environment it failed in ({environment_source}):"]
        lines += [f"  {key}: {'; '.join(value.splitlines())[:_MAX_HEADER_TEXT]}" for key, value in environment.items()]
    return [
        *lines,
        "",
        run_line,
        "While the bug is there it exits non-zero: the exception's traceback on stderr, then a",
        "'repro failed with:' line to hold against the signature above (a crash: the process dies",
        "by that signal). Once fixed it prints 'repro passed' and exits 0.",
    ]


_IMPORTS = """
import argparse
import copy
import sys
from pathlib import Path

import torch
import torch._inductor.config
from torch._dynamo.debug_utils import AccuracyError, cast_to_fp64
from torch._dynamo.utils import clone_inputs, same
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

# symbolic_trace cannot trace a higher-order op (cond checks its operands are tensors); make_fx
# runs the module on the inputs and records the same aten ops and subgraphs.
_TRACE_MAKE_FX = """
def trace_repro(module, inputs):
    \"\"\"The module as an fx.GraphModule, the graph minify tested, its subgraphs as submodules.\"\"\"
    from torch.fx.experimental.proxy_tensor import make_fx

    with torch.no_grad():
        return make_fx(module)(*clone_inputs(inputs))
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

_RUN_FUNCTIONS = '''
def load_inputs(path):
    inputs = torch.load(path, weights_only=True)
    return [value.to(DEVICE) if isinstance(value, torch.Tensor) else value for value in inputs]


def synchronize():
    if torch.device(DEVICE).type == "cuda":
        torch.cuda.synchronize()  # surface asynchronous errors and crashes here


def check_accuracy(gm, inputs, result):
    """torch's accuracy minifier semantics: compare with eager, judged against an fp64 reference."""
    reference = copy.deepcopy(gm)(*clone_inputs(inputs))
    fp64_reference = None
    if torch._dynamo.config.same_two_models_use_fp64:
        try:
            fp64_gm, fp64_inputs = cast_to_fp64(copy.deepcopy(gm), clone_inputs(inputs))
            fp64_reference = fp64_gm(*fp64_inputs)
        except Exception:
            if not STRICT_ACCURACY:  # non-strict accuracy cannot be judged without fp64
                print("cannot compute the fp64 reference this accuracy check needs", file=sys.stderr)
                raise
    if not same(reference, result, fp64_reference, tol=TOLERANCE, equal_nan=True,
                ignore_non_fp=not STRICT_ACCURACY):
        raise AccuracyError("Bad accuracy detected")


def main():
    parser = argparse.ArgumentParser(description="Run the minimized repro.")
    parser.add_argument("--inputs", type=Path, default=Path(__file__).resolve().with_name("inputs.pt"))
    inputs = load_inputs(parser.parse_args().inputs)
    gm = trace_repro(Repro(), inputs)
    compiled = compile_repro(gm, list(inputs))
    result = compiled(*clone_inputs(inputs))
    synchronize()
    if FAILURE_KIND == "accuracy":
        check_accuracy(gm, inputs, result)
    print(f"repro passed: no failure ({BACKEND} on {DEVICE}, torch {torch.__version__})")


def explain_failure(exc_type, error, traceback):
    """After the usual traceback, the exception chain down to its root cause, and the signature in
    the form minify recorded it (same rules, above), to hold against the expected one."""
    sys.__excepthook__(exc_type, error, traceback)
    print(file=sys.stderr)
    chain = exception_chain(error)
    if len(chain) > 1:
        print("exception chain:   " + "\\n                   <- ".join(describe_chain(chain)), file=sys.stderr)
    # An accuracy failure's signature is its type alone, as minify records it.
    observed = exc_type.__name__ if isinstance(error, AccuracyError) else signature_line(error)
    print(f"repro failed with: {observed}", file=sys.stderr)
    print(f"minify expected:   {EXPECTED_SIGNATURE}", file=sys.stderr)


if __name__ == "__main__":
    sys.excepthook = explain_failure
    main()
'''


def _signature_rules() -> str:
    """minify_client/signatures.py, verbatim: how the repro names its failure, as minify does."""
    source = inspect.getsource(signatures).replace("from __future__ import annotations\n", "")
    return "# " + "-" * 20 + " minify's signature rules (minify_client/signatures.py, verbatim) " + "-" * 7 + \
        "\n" + source.strip("\n") + "\n\n# " + "-" * 93


def _compile_functions(backend: str, shapes: DynamicShapes | None) -> list[str]:
    """`compile_repro`; with dynamic dims, what keeps them symbolic as the worker does: aot_inductor
    exports with them, any other backend (then `backend_repro`) runs under torch.compile with them
    marked (`minify_worker.backends`)."""
    symbolic = shapes is not None and backend != "aot_inductor"
    if backend == "inductor":
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
        with torch._dynamo.config.patch(assume_static_by_default=False):
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


def _constants(spec: JobSpec, kind: str, signature: Signature | None) -> str:
    return "\n".join([
        f"BACKEND = {spec.backend!r}",
        f"DEVICE = {spec.device!r}",
        f"FAILURE_KIND = {kind!r}",
        f"TOLERANCE = {spec.failure.tolerance!r}",
        f"STRICT_ACCURACY = {spec.failure.strict_accuracy!r}",
        f"EXPECTED_SIGNATURE = {str(signature) if signature is not None else '(not recorded)'!r}",
    ])


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
    return _TRACE_MAKE_FX if subgraphs(graph) else _TRACE_SYMBOLIC


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
