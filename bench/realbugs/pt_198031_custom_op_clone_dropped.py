"""A custom op that writes into x reading from a clone of x: inductor drops the clone and passes x twice.

issue:    https://github.com/pytorch/pytorch/issues/198031
checks:   compiled `y = x.clone(); rotate_into(y, x); return x + 1` (a mutating custom op that reads y while it
          writes x) leaves x and the result as eager does
fails on: 2.13.0+cpu (checked here); the issue: 2.14.0 and nightly 2.15, CPU (and user Triton kernels on CUDA)
kind:     wrong values (float)
feature:  custom ops (torch.library.custom_op, mutates_args), inductor reinplacing / auto_functionalized
"""

import torch


@torch.library.custom_op("realbugs_198031::rotate_into", mutates_args=("dst",))
def rotate_into(src: torch.Tensor, dst: torch.Tensor) -> None:
    n = src.shape[0]
    for k in range(n):  # element by element: an aliased src sees dst's earlier writes
        dst[k] = src[(k + 1) % n]


def rotate_in_place(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    rotate_into(y, x)
    return x + 1


def test_pt_198031_custom_op_clone_dropped() -> None:
    x = torch.arange(6.0)
    eager_x, compiled_x = x.clone(), x.clone()
    expected = rotate_in_place(eager_x)
    actual = torch.compile(rotate_in_place)(compiled_x)
    assert torch.equal(compiled_x, eager_x), f"compiled x {compiled_x.tolist()} != eager x {eager_x.tolist()}"
    assert torch.equal(actual, expected), f"compiled {actual.tolist()} != eager {expected.tolist()}"


if __name__ == "__main__":
    test_pt_198031_custom_op_clone_dropped()
