"""An out-of-range index tensor into a pointwise result, compiled on CPU: the fused kernel's bounds check throws inside
a parallel region and the process aborts ("terminate called after throwing an instance of 'std::runtime_error'").

issue:    https://github.com/pytorch/pytorch/issues/195402
checks:   compiled `(x - 0.5)[idx]` with x of shape (1, 8, 66, 66) and idx = [[1]] (past dim 0's size 1) raises an
          IndexError/RuntimeError as eager does
fails on: 2.13.0+cpu (checked here: SIGABRT, "index out of bounds: 0 <= tmp7 < 1L"); the issue: nightly, CPU (only
          once the tensor is large enough for the kernel to be parallelised)
kind:     crash
feature:  inductor C++ kernels (indirect-indexing bounds checks inside OpenMP regions)
"""

import torch


def shifted_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    return (x - 0.5)[rows]


def test_pt_195402_shifted_gather_oob_abort() -> None:
    x = torch.randn(1, 8, 66, 66)
    rows = torch.tensor([[1]])
    try:
        shifted_rows(x, rows)
    except (IndexError, RuntimeError):
        pass
    else:
        raise AssertionError("eager no longer raises: the premise of this case changed")
    try:
        torch.compile(shifted_rows)(x, rows)
    except (IndexError, RuntimeError):
        return
    raise AssertionError("compiled returned instead of raising")


if __name__ == "__main__":
    test_pt_195402_shifted_gather_oob_abort()
