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
def test_inductor_merges_every_view_that_changes_nothing_with_its_base() -> None:
    """The family, in one compiled graph: each view that changes nothing comes back as its base's
    object; `flatten` of a 1-D tensor is its base eagerly too (not said), `unsqueeze` a view of its
    own compiled as eagerly (not said)."""
    def views(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        base = x + 1
        return (base, base.view(-1), base.reshape(base.shape), base[...], base.view_as(base),
                torch.ops.aten.alias(base), base.flatten(), base.unsqueeze(0))

    torch._dynamo.reset()
    x = torch.zeros(3)
    found = merged_outputs(views(x.clone()), torch.compile(views)(x.clone()))
    assert found is not None
    merged = {part.split(" are ")[0] for part in found.split("; ")}
    assert {f"outputs 0 and {position}" for position in (1, 2, 3, 4, 5)} <= merged
    assert not any(part.endswith(" and 7") for part in merged)  # the unsqueezed view stays its own
