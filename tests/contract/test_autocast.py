"""A program compiled inside an autocast region (pytorch#179804): the capture records the region
(`JobSpec.autocast`), the worker and repro.py run the forward in it and take gradients after it,
and the fp64 reference reaches into every subgraph (an autocast region's body is one)."""

from __future__ import annotations

import copy

import pydantic
import pytest
import torch
from torch._dynamo.debug_utils import cast_to_fp64

from minify_client.capture.failed_graph import spec_for
from minify_client.capture.torch_hooks import FailedCompile, ambient_autocast
from minify_contract.accuracy import autocast_off, autocast_region, fp64_copy, gradients
from minify_contract.models import JobSpec

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_region_a_compile_failed_in_goes_into_its_spec(dtype: torch.dtype) -> None:
    assert ambient_autocast() is None
    graph = torch.fx.symbolic_trace(torch.nn.ReLU())
    with torch.autocast("cpu", dtype=dtype):
        failed = FailedCompile(level="dynamo", error=RuntimeError("x"), backend="aot_eager", config={}, graph=graph)
    outside = FailedCompile(level="dynamo", error=RuntimeError("x"), backend="aot_eager", config={}, graph=graph)

    name = str(dtype).removeprefix("torch.")
    assert spec_for(failed).autocast.model_dump() == {"device": "cpu", "dtype": name}
    assert spec_for(outside).autocast is None


@pytest.mark.parametrize("autocast", [{"device": "cpu", "dtype": "float32"}, {"device": "tpu", "dtype": "bfloat16"},
                                      {"device": "cpu"}])
def test_a_region_autocast_cannot_make_is_refused(autocast: dict) -> None:
    with pytest.raises(pydantic.ValidationError, match="autocast"):
        JobSpec.model_validate({"autocast": autocast})


def test_the_forward_runs_in_the_region_and_gradients_are_taken_after_it() -> None:
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    spec = JobSpec.model_validate({"autocast": {"device": "cpu", "dtype": "bfloat16"}})

    with autocast_region(spec.autocast):
        assert (x @ w).dtype == torch.bfloat16
        with autocast_off():
            assert (x @ w).dtype == torch.float32
        (in_region,) = gradients(lambda a, b: a @ b, [x, w], [1])
    with autocast_region(None):
        assert (x @ w).dtype == torch.float32

    weight = w.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = x @ weight
    (after,) = torch.autograd.grad(out.sum(), [weight])
    torch.testing.assert_close(in_region, after)  # as the program's backward after the region


def test_the_fp64_reference_reaches_into_an_autocast_region_s_body() -> None:
    """Export records the dtype of `.float()` in the region's body with an assert, which casting the
    program to fp64 trips on purpose: removed in every subgraph, as at the top."""
    class Product(torch.nn.Module):
        def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            with torch.autocast("cpu", enabled=False):
                return x.float() @ w.float().T

    def compiled(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return Product()(x, w)

    graphs = []
    torch._dynamo.reset()
    torch.compile(compiled, backend=lambda gm, inputs: graphs.append(gm) or gm)(torch.randn(2, 3), torch.randn(3, 3))
    program = torch.export.export(graphs[0], (torch.randn(2, 3), torch.randn(3, 3)), strict=False)
    module = program.module(check_guards=False)

    assert _asserts(module)["submod_1"]  # in the region's body, which torch's cast_to_fp64 trips on
    with pytest.raises(RuntimeError, match="dtype mismatch"):
        model, inputs = cast_to_fp64(copy.deepcopy(module), [torch.randn(2, 3), torch.randn(3, 3)])
        model(*inputs)

    model, inputs = fp64_copy(module, [torch.randn(2, 3), torch.randn(3, 3)])

    assert not any(_asserts(model).values())
    assert model(*inputs)[0].isfinite().all()


def _asserts(module: torch.nn.Module) -> dict[str, int]:
    return {name: sum(node.target is torch.ops.aten._assert_tensor_metadata.default for node in graph.graph.nodes)
            for name, graph in module.named_modules() if isinstance(graph, torch.fx.GraphModule)}


def test_a_backend_no_spec_can_name_is_replaced_by_inductor_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    """A local function as the backend: the spec names inductor, and the warning comes once a
    process, not once per pending capture (one before each compile and first run)."""
    def my_backend(gm: torch.fx.GraphModule, inputs: list) -> torch.fx.GraphModule:
        return gm

    graph = torch.fx.symbolic_trace(torch.nn.ReLU())
    failed = FailedCompile(level="dynamo", error=RuntimeError("x"), backend=repr(my_backend), config={}, graph=graph)
    with caplog.at_level("WARNING", logger="minify_client.capture.failed_graph"):
        specs = [spec_for(failed) for _ in range(3)]
    assert {spec.backend for spec in specs} == {"inductor"}
    said = [record.getMessage() for record in caplog.records if "cannot go in a job spec" in record.getMessage()]
    assert len(said) == 1 and "edit it before submitting" in said[0], said
