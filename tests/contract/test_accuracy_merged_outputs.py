"""Two outputs that are one tensor compiled and two eager (`accuracy.merged_outputs`, pytorch#191449).

A graph returning an intermediate beside a view of it that changes nothing (`view(-1)` of a 1-D
tensor, a reshape to its own shape, `[...]`, `view_as`, `aten.alias`) gets the intermediate twice
from inductor: the values agree, but what the program then does to the view's metadata
(`resize_`, `set_`, an in-place transpose) happens to the intermediate too, in eager code after the
graph, where no graph's values show it. The capture, the worker and repro.py key it `AccuracyError:
outputs merged` (tests/test_realbugs.py takes #191449 through all three).
"""

from __future__ import annotations

import pytest
import torch

from minify_contract.accuracy import merged_outputs


@pytest.mark.fast
def test_one_object_compiled_where_eager_has_two_is_said_once_per_later_output() -> None:
    base = torch.zeros(3)
    view = base.view(-1)
    assert merged_outputs((base, view), (base, base)) == "outputs 0 and 1 are one tensor compiled, two eager"
    assert merged_outputs((base, view, base + 1), (base, base, base)) == (
        "outputs 0 and 1 are one tensor compiled, two eager; outputs 0 and 2 are one tensor compiled, two eager")


@pytest.mark.fast
def test_objects_eager_also_returns_once_or_that_stay_apart_are_not_said() -> None:
    base = torch.zeros(3)
    assert merged_outputs((base, base), (base, base)) is None  # `return (x, x)`: one object eagerly too
    assert merged_outputs((base, base.view(-1)), (base, base.view(-1))) is None
    assert merged_outputs([base, 2], [base, 2]) is None  # non-tensor outputs are no tensor
    assert merged_outputs((base, base.view(-1)), (base,)) is None  # an output count differing is another rule's


@pytest.mark.inductor
def test_the_rule_says_exactly_the_views_inductor_returned_as_their_base() -> None:
    """The family, in one compiled graph: torch 2.11's and 2.13's inductor return each view that
    changes nothing as its base's object (2.15's keeps them apart: then nothing is said); `flatten`
    of a 1-D tensor is its base eagerly too, and `unsqueeze` is a view of its own compiled as
    eagerly: neither is ever said with the base."""
    def views(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        base = x + 1
        return (base, base.view(-1), base.reshape(base.shape), base[...], base.view_as(base),
                torch.ops.aten.alias(base), base.flatten(), base.unsqueeze(0))

    torch._dynamo.reset()
    x = torch.zeros(3)
    eager, compiled = views(x.clone()), torch.compile(views)(x.clone())
    found = merged_outputs(eager, compiled) or ""
    said = {part.split(" are ")[0] for part in found.split("; ") if part}
    for position in range(1, 8):
        merged = compiled[0] is compiled[position] and eager[0] is not eager[position]
        assert (f"outputs 0 and {position}" in said) == merged, (position, found)
    assert "outputs 0 and 6" not in said and "outputs 0 and 7" not in said
    if torch.__version__ < "2.14":  # seen with pytorch#191449 here (2.11, 2.13): the whole family merged
        assert {f"outputs 0 and {position}" for position in range(1, 6)} <= said
