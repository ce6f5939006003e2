"""Cheap backends for the accuracy capture's families (issue 38): wrong gradients, missing errors and
runtime errors, each on a chosen op, with no compiler. Sandbox children import them by path
(`tests.client.capture.test_accuracy_backends:wrong_grad_on_sin`) when `MINIFY_ALLOWED_BACKENDS` names this module
(the `allowed` fixture of the test files that use them).

Each backend runs the graph it is handed eagerly (an `fx.Interpreter`), op by op, as the dynamo graph
(torch functions, `operator.matmul`) or the exported one (aten ops) names them, and goes wrong only
on its op:
- `wrong_grad_on(ops)`: the op's result unchanged, its gradient doubled (`y.detach() + 2 * (y - y.detach())`);
- `drop_dtype_check_on(ops)`: the op's floating-point arguments cast to float32 first, so mixed dtypes
  that eager refuses return a result (the check the compiler dropped);
- `clamp_indices_on(ops)`: the op's integer index arguments clamped into range (a dropped bounds check);
- `raise_at_run_on(ops)`: the compiled graph raises when run (a kernel's own assertion);
- `save_copies`: the graph run on copies of the inputs that need no grad (a lost version check).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import fx

MODULE = "tests.client.capture.test_accuracy_backends"
Backend = Callable[[fx.GraphModule, list[Any]], Callable[..., Any]]


def op_name(target: Any) -> str:
    """"mm" for `aten.mm.default`, "matmul" for `operator.matmul`, the function's name otherwise."""
    packet = getattr(target, "overloadpacket", None)
    return getattr(packet if packet is not None else target, "__name__", str(target))


def _interpreting(change: Callable[[str, tuple[Any, ...], Callable[[tuple[Any, ...]], Any]], Any],
                  ops: Iterable[str]) -> Backend:
    names = frozenset(ops)

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        class Changed(fx.Interpreter):
            def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
                call = super().call_function
                if op_name(target) in names:
                    return change(op_name(target), tuple(args), lambda changed: call(target, changed, kwargs))
                return call(target, args, kwargs)

            def call_method(self, target: Any, args: Any, kwargs: Any) -> Any:
                call = super().call_method
                if target in names:
                    return change(target, tuple(args), lambda changed: call(target, changed, kwargs))
                return call(target, args, kwargs)

        def run(*args: Any) -> Any:
            return Changed(gm).run(*args)

        return run

    return backend


def wrong_grad_on(*ops: str) -> Backend:
    def change(name: str, args: tuple[Any, ...], call: Callable[[tuple[Any, ...]], Any]) -> Any:
        result = call(args)
        if isinstance(result, torch.Tensor) and result.requires_grad:
            return result.detach() + (result - result.detach()) * 2
        return result

    return _interpreting(change, ops)


def drop_dtype_check_on(*ops: str) -> Backend:
    def change(name: str, args: tuple[Any, ...], call: Callable[[tuple[Any, ...]], Any]) -> Any:
        return call(tuple(value.float() if isinstance(value, torch.Tensor) and value.is_floating_point() else value
                          for value in args))

    return _interpreting(change, ops)


def clamp_indices_on(*ops: str) -> Backend:
    def change(name: str, args: tuple[Any, ...], call: Callable[[tuple[Any, ...]], Any]) -> Any:
        source, dim = args[0], args[1]
        return call(tuple(value.clamp(0, source.shape[dim] - 1)
                          if isinstance(value, torch.Tensor) and not value.is_floating_point() else value
                          for value in args))

    return _interpreting(change, ops)


def raise_at_run_on(*ops: str) -> Backend:
    names = frozenset(ops)

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        if not any(node.op in ("call_function", "call_method") and op_name(node.target) in names
                   for node in gm.graph.nodes):
            return gm.forward

        def run(*args: Any) -> Any:
            raise AssertionError(f"expected size {len(args)}=={len(args)}, stride 1==2 at dim=0 (injected)")

        return run

    return backend


def save_copies(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Run eagerly on copies of the inputs that do not require grad: autograd saves the copies, so
    an input modified in place before the backward goes unnoticed (the check pytorch#197887 lost)."""
    def run(*args: Any) -> Any:
        return gm(*[value.clone() if isinstance(value, torch.Tensor) and not value.requires_grad else value
                    for value in args])

    return run


wrong_grad_on_sin = wrong_grad_on("sin")
wrong_grad_on_amin = wrong_grad_on("amin")
wrong_grad_on_matmul = wrong_grad_on("matmul", "mm")
wrong_grad_on_softmax = wrong_grad_on("softmax", "_softmax")
drop_dtype_check_on_mm = drop_dtype_check_on("mm", "matmul", "addmm", "linear", "bmm", "dot")
clamp_indices_on_index_select = clamp_indices_on("index_select")
raise_at_run_on_relu = raise_at_run_on("relu")
raise_at_run_on_cumsum = raise_at_run_on("cumsum")
raise_at_run_on_index_select = raise_at_run_on("index_select")


def test_the_backends_go_wrong_only_on_their_op() -> None:
    gm = fx.symbolic_trace(lambda x: torch.sin(x).cos())
    x = torch.randn(4, requires_grad=True)
    eager = torch.autograd.grad(gm(x).sum(), x)[0]
    assert torch.equal(wrong_grad_on("cos")(gm, [x])(x), gm(x))
    assert not torch.allclose(torch.autograd.grad(wrong_grad_on("cos")(gm, [x])(x).sum(), x)[0], eager)
    assert torch.allclose(torch.autograd.grad(wrong_grad_on("relu")(gm, [x])(x).sum(), x)[0], eager)


def minimize_capture(directory: Any, out: Any, expected_ops: list[str]) -> Any:
    """The capture in `directory` minimized by the engine in this process (culprit, versions and
    shrink off: minimality is the claim), checked to end at `expected_ops`; then its repro.py run in
    a fresh process, which must fail. Returns (the job's spec, the repro's completed process)."""
    from pathlib import Path

    from minify_contract.models import JobSpec
    from minify_worker.engine import minify
    from minify_worker.programs.fx.backends import ALLOWED_BACKENDS_ENV
    from tests.support.graphs import ops_of
    from tests.support.repro import run_repro

    directory, out = Path(directory), Path(out)
    spec = JobSpec.model_validate_json((directory / "spec.json").read_text()).model_copy(
        update={"culprit": False, "versions": False, "shrink": False})
    (program,) = directory.glob("*.pt2")
    result = minify(program, spec, out, inputs=directory / "inputs.pt")
    assert result.status.value == "succeeded", result.reason
    assert ops_of(result.report.graph_code or "") == expected_ops
    ran = run_repro(out / "repro.py", **{ALLOWED_BACKENDS_ENV: MODULE})
    assert ran.returncode != 0, ran.stdout[-2000:]
    return spec, ran
