"""NumPy code under torch.compile: np.cumsum of an int8 array accumulates in int8 and wraps, NumPy accumulates in int64.

issue:    https://github.com/pytorch/pytorch/issues/198056
checks:   compiled `np.cumsum(a)` of an int8 ndarray [-128, -100, -3, 0, 5, 100, 127] equals NumPy's
          [-128, -228, -231, -231, -226, -126, 1] (int64); compiled returns int8 values that wrapped
          ([-128, 28, 25, ...])
fails on: 2.13.0+cpu (checked here); the issue: 2.14.0 and nightly (backend="eager" is enough)
kind:     wrong values (integer)
feature:  dynamo NumPy tracing (torch._numpy result-type rules for small integer dtypes), no inductor needed
"""

import numpy as np
import torch


def running_total(a: np.ndarray) -> np.ndarray:
    return np.cumsum(a)


def test_pt_198056_numpy_int8_cumsum() -> None:
    a = np.array([-128, -100, -3, 0, 5, 100, 127], dtype=np.int8)
    expected = running_total(a)
    actual = torch.compile(running_total)(a)
    assert actual.dtype == expected.dtype, f"compiled dtype {actual.dtype} != NumPy's {expected.dtype}"
    assert np.array_equal(actual, expected), f"compiled {actual.tolist()} != NumPy's {expected.tolist()}"


if __name__ == "__main__":
    test_pt_198056_numpy_int8_cumsum()
