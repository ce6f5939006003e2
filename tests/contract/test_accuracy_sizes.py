"""The accuracy rule on floating-point outputs of another shape than eager's (a size the values
decide): the fp64 reference's shape tells a wrong size from rounding (`size_divergence`), and the
outputs of eager's shape are still judged by torch's rule. Pure: no compile, no child."""

from __future__ import annotations

import pytest
import torch

from minify_contract.accuracy import divergence, float_divergence, size_divergence

pytestmark = pytest.mark.fast

EAGER = torch.tensor([0.5, 1.0, 2.0])


def test_a_size_the_fp64_reference_shares_with_eager_is_wrong() -> None:
    found = float_divergence((EAGER,), (EAGER[:-1],), (EAGER.double(),))
    assert found == "float output 0: shape (2,), eager (3,) (the fp64 reference's too)"


def test_a_size_of_one_is_not_broadcast_into_agreement() -> None:
    """torch's allclose broadcasts a size of one: [0.5] against [0.5, 0.5] would pass."""
    eager = torch.tensor([0.5, 0.5])
    assert float_divergence((eager,), (eager[:1],), (eager.double(),)) is not None


def test_a_size_the_fp64_reference_does_not_share_with_eager_is_rounding() -> None:
    fp64 = torch.tensor([0.5, 1.0, 1.5, 2.0], dtype=torch.float64)  # the compiled size is fp64's
    assert float_divergence((EAGER,), (fp64.float(),), (fp64,)) is None


def test_without_a_reference_a_size_passes_unless_strict() -> None:
    assert float_divergence((EAGER,), (EAGER[:-1],), None) is None
    strict = float_divergence((EAGER,), (EAGER[:-1],), None, strict=True)
    assert strict == "float output 0: shape (2,), eager (3,) (no fp64 reference)"


def test_the_other_outputs_are_still_judged_by_torchs_rule() -> None:
    other = torch.ones(4)
    fp64 = torch.tensor([0.5, 1.0, 1.5, 2.0], dtype=torch.float64)
    rounded = (EAGER, other), (fp64.float(), other), (fp64, other.double())
    assert float_divergence(*rounded) is None
    wrong = (EAGER, other), (fp64.float(), other + 1), (fp64, other.double())
    assert float_divergence(*wrong) not in (None, "")  # torch's rule logs what differs


def test_integer_outputs_and_equal_shapes_are_left_as_they_were() -> None:
    outputs = (EAGER, torch.tensor([1, 2]))
    same_shapes = size_divergence(outputs, outputs, (EAGER.double(), torch.tensor([1, 2])))
    assert same_shapes[0] is None and same_shapes[1] is outputs
    assert divergence(outputs, (EAGER, torch.tensor([1, 3])), None) is not None  # exactly compared, as before


def test_a_different_number_of_outputs_is_left_to_torchs_rule() -> None:
    assert size_divergence((EAGER,), (EAGER, EAGER), None)[0] is None
    assert float_divergence((EAGER,), (EAGER, EAGER), None) is not None
