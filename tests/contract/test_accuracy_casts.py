"""The fp64 reference through a program's own casts to a lower float type.

torch's `cast_to_fp64` rewrites `convert_element_type` and `dtype=` keywords only: an output computed
after `x.float()`, `x.to(torch.float32)` or `aten.to.dtype(x, torch.float32)` stayed float32, torch's
rule then had no fp64 reference for it and, non-strict, passed it whatever it held. Mixed precision
code ends that way (`y.float()` after an autocast region), so did its accuracy bugs: never judged.
The family: each way a graph casts, as dynamo's graph (methods) and as aten ops (export's).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.fx as fx

from minify_contract.accuracy import float_divergence, fp64_copy, fp64_reference

pytestmark = pytest.mark.fast

aten = torch.ops.aten

CASTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "float": lambda y: y.float(),
    "half_then_float": lambda y: y.half().float(),
    "to_dtype": lambda y: y.to(torch.float32),
    "to_dtype_keyword": lambda y: y.to(dtype=torch.float32),
    "aten_to_dtype": lambda y: aten.to.dtype(y, torch.float32),
    "aten_to_copy": lambda y: aten._to_copy.default(y, dtype=torch.float32),
}


@pytest.mark.parametrize("cast", CASTS.values(), ids=CASTS.keys())
def test_an_output_after_a_cast_is_judged_against_fp64(cast: Callable[[torch.Tensor], torch.Tensor]) -> None:
    class Program(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sin(cast(x * 3.0))

    gm = fx.symbolic_trace(Program())
    x = torch.randn(4, 8)
    reference = gm(x)
    wrong = reference + 0.5  # a compiled program that is off everywhere

    fp64 = fp64_reference(gm, [x])

    assert fp64.dtype == torch.float64
    assert float_divergence((reference,), (wrong,), (fp64,)), "passed: no fp64 reference for it"
    assert float_divergence((reference,), (reference.clone(),), (fp64,)) is None


def test_the_program_s_own_module_is_left_as_it_is() -> None:
    gm = fx.symbolic_trace(torch.nn.Sequential(torch.nn.Identity()))
    gm.graph.call_method("float", (next(iter(gm.graph.nodes)),))
    before = gm.code

    fp64_copy(gm, [torch.randn(2)])

    assert gm.code == before
