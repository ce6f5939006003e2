"""Failures a captured program cannot carry: said at capture time, instead of a job that ends
`not_reproducible` after the worker compiled the program and it passed.

A capture at the dynamo level is the graph a `torch.compile` backend received, exported as a
program; the worker compiles that program for inference (forward only, under `no_grad` for
inductor). A compile for training (grad mode on, an input requiring grad) does more with the same
graph before any compiler sees a kernel: AOT autograd traces the joint forward-and-backward graph
and its partitioner splits it into a forward and a backward graph. A failure there (pytorch#172956:
`AssertionError: Node add was invalid, but is output` in `min_cut_rematerialization_partition`)
happens only in a training compile; the worker's inference compile of the captured program never
partitions anything and passes. A custom `torch.autograd.Function` makes it worse: dynamo hands
the backend its forward and backward (`autograd_function_apply`), and `torch.export` keeps the
forward only, so no exported program holds the backward the partitioner failed on.

A failure whose own traceback shows it was raised in AOT autograd's partitioner, or while AOT
autograd traced the backward of the joint graph, is captured with `failure.training` set
(`needs_training`): the worker then compiles the program for training (grad mode on, its
floating-point inputs requiring grad), and so does repro.py, so the joint graph is traced and
partitioned as it was for the user. A graph with custom autograd.Functions is then not exported:
it is lowered with each Function kept, forward and backward (`autograd_functions`), and written
as program.json; `unreproducible(failed, error)` is the reason given where that lowering fails. A
training compile that fails later (in the forward's compiler, inductor lowering a kernel) is
captured as before: the forward graph the worker compiles holds what that failure needs. The
user's program is not touched: this reads the exception's traceback and the graph, and runs nothing.

`accuracy_signature(error)`: wrong values are signed as the worker signs them. The worker keys an
accuracy failure that only integer or boolean outputs show (`AccuracyError: integer outputs only`,
`minify_worker.outcomes.INTEGER_ONLY`), so that a float failure and an integer one never drift
into each other; a capture that signed #175966's wrong int64 values plain `AccuracyError` made a
job whose original failed "not with the signature the spec gives", which ended `not_reproducible`.
Wrong values only the inputs a graph writes into show, its outputs agreeing (a wrong write-back of
an input mutation), are keyed `AccuracyError: written inputs only` (`accuracy.written_inputs`,
`accuracy.WRITTEN_INPUTS_ONLY`), as the worker keys them, and so are two outputs that are one
tensor compiled (`accuracy.merged_outputs`, `OUTPUTS_MERGED`): `accuracy.detail_key`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from minify_contract.accuracy import ACCURACY_EXC_TYPE, detail_key

from .torch_hooks import FailedCompile

# Where AOT autograd partitions a joint graph, and where it traces the joint graph's backward
# (torch 2.11-2.13: `torch/_functorch/partitioners.py`; the joint's `torch.autograd.grad` call).
_PARTITIONER = "torch/_functorch/partitioners.py"
_AOT_AUTOGRAD = "torch/_functorch/_aot_autograd/"
_BACKWARD = (("torch/autograd/__init__.py", "grad"), ("torch/autograd/graph.py", "_engine_run_backward"))


def accuracy_signature(error: BaseException) -> str:
    """The signature of the wrong values an `AccuracyError` describes, as the worker's report
    writes it: keyed by `accuracy.detail_key` (`AccuracyError: integer outputs only` when every
    part of its detail is an integer or boolean output's, `accuracy.divergence` joining the
    floating-point outputs' detail, torch's words, and the integer ones', each `output N: ...`,
    with "; "), else `AccuracyError`. Other errors by their type (`GradientError`)."""
    name = type(error).__name__
    key = detail_key(str(error)) if name == ACCURACY_EXC_TYPE else ""
    return f"{name}: {key}" if key else name


def unreproducible(failed: FailedCompile, lowering_error: str) -> str:
    """Why `failed` (a dynamo graph that failed in AOT autograd's training compile) is not
    captured: its custom autograd.Functions could not be kept (`lowering_error`), and an exported
    program would lose their backward."""
    stage = _training_stage_of(failed) or "joint graph"
    functions = autograd_functions(failed.graph)
    names = ", ".join(functions)
    return (f"the compile failed in AOT autograd's {stage}, which only a compile for training does; the "
            f"custom autograd.Function{'s' if len(functions) > 1 else ''} ({names}) of the graph could not be "
            f"kept with {'their' if len(functions) > 1 else 'its'} backward ({lowering_error}), and torch.export "
            "keeps a Function's forward only: the failing graph is not captured. Next: TORCH_LOGS=aot_joint_graph "
            "prints the joint graph AOT autograd failed on; report it to PyTorch (module: aotdispatch) with this "
            "test or script as the repro")


def needs_training(failed: FailedCompile) -> bool:
    """Whether the program captured from `failed` must be compiled for training to fail as it did:
    a compile error raised in AOT autograd's partitioner or its tracing of the joint graph's backward."""
    return _training_stage_of(failed) is not None


def _training_stage_of(failed: FailedCompile) -> str | None:
    if failed.level != "dynamo" or failed.program is not None or failed.kind != "compile_error":
        return None
    return training_stage(failed.error)


def training_stage(error: BaseException) -> str | None:
    """"partitioner" or "backward tracing" when `error`'s chain was raised there (see the module's
    docstring), judged by its tracebacks' frames; None otherwise."""
    for link in _chain(error):
        frames = list(_frames(link.__traceback__))
        if any(filename.endswith(_PARTITIONER) for filename, _ in frames):
            return "partitioner (splitting the joint forward-and-backward graph)"
        inside_aot = False
        for filename, function in frames:
            inside_aot = inside_aot or _AOT_AUTOGRAD in filename
            if inside_aot and any(filename.endswith(path) and function == name for path, name in _BACKWARD):
                return "tracing of the joint graph's backward"
    return None


def autograd_functions(graph: Any) -> list[str]:
    """The custom autograd.Functions dynamo put in `graph` (a GraphModule) as
    `autograd_function_apply`, by class name where the node's stack trace names it (`Name.apply(`)."""
    if graph is None:
        return []
    found: dict[str, None] = {}
    for node in graph.graph.nodes:
        if node.op != "call_function" or getattr(node.target, "__name__", "") != "autograd_function_apply":
            continue
        named = re.findall(r"(\w+)\.apply\(", node.meta.get("stack_trace") or "")  # the innermost frame's last
        found[named[-1] if named else "autograd_function_apply"] = None
    return list(found)


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen and len(seen) < 16:
        seen.add(id(current))
        yield current
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)


def _frames(traceback: TracebackType | None) -> Iterator[tuple[str, str]]:
    while traceback is not None:
        code = traceback.tb_frame.f_code
        yield code.co_filename.replace("\\", "/"), code.co_name
        traceback = traceback.tb_next
