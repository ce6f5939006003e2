"""layer_norm of a jagged nested tensor built inside the compiled function: dynamo fails building its shape guards.

issue:    https://github.com/pytorch/pytorch/issues/183369
checks:   compiled `layer_norm(nested_tensor_from_jagged(v, offsets), [12]).values().sum()` compiles and
          matches eager (eager runs, backward included)
fails on: 2.13.0+cpu (checked here: IndexError in guard creation); the issue: 2.13, CPU and CUDA
kind:     compile error
feature:  dynamo guards on nested (jagged) tensor symbols
"""

import torch
import torch.nn.functional as F


def normed_total(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    nt = torch.nested.nested_tensor_from_jagged(values, offsets)
    return F.layer_norm(nt, [12]).values().sum()


def test_pt_183369_jagged_layer_norm_guard() -> None:
    torch.manual_seed(11)
    values = torch.randn(20, 12, requires_grad=True)
    offsets = torch.tensor([0, 6, 11, 14, 20])
    expected = normed_total(values, offsets)
    actual = torch.compile(normed_total)(values.detach().clone().requires_grad_(True), offsets)
    torch.testing.assert_close(actual, expected)


if __name__ == "__main__":
    test_pt_183369_jagged_layer_norm_guard()
