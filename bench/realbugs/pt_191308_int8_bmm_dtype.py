"""A batched int8 matmul compiled on CPU returns int64 where eager returns int8.

issue:    https://github.com/pytorch/pytorch/issues/191308
checks:   compiled `matmul(a, b)` of int8 (1, 1, 2) @ (1, 2, 2) has eager's dtype and values
fails on: 2.13.0+cpu (checked here); the issue: 2.13 and 2.14 nightly, CPU
kind:     wrong values (integer)
feature:  inductor CPU lowering (integer bmm), dtypes
"""

import torch


def multiply(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.matmul(a, b)


def test_pt_191308_int8_bmm_dtype() -> None:
    a = torch.ones((1, 1, 2), dtype=torch.int8)
    b = torch.ones((1, 2, 2), dtype=torch.int8)
    expected = multiply(a, b)
    actual = torch.compile(multiply, fullgraph=True, dynamic=False)(a, b)
    assert actual.dtype == expected.dtype and torch.equal(actual, expected), (
        f"compiled {actual.dtype} {actual.tolist()}, eager {expected.dtype} {expected.tolist()}")


if __name__ == "__main__":
    test_pt_191308_int8_bmm_dtype()
