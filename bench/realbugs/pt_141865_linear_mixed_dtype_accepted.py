"""nn.Linear with float32 weights on a float16 input, compiled on CPU: no dtype error, a result.

issue:    https://github.com/pytorch/pytorch/issues/141865
checks:   the compiled module raises as eager does ("mat1 and mat2 must have the same dtype")
fails on: 2.13.0+cpu (checked here); the issue: 2.6 nightly, CPU only
kind:     missing error
feature:  inductor lowering (mm dtype checks), nn.Module
"""

import torch


def test_pt_141865_linear_mixed_dtype_accepted() -> None:
    model = torch.nn.Linear(1, 1).eval()
    x = torch.randn(1, 1, dtype=torch.float16)
    try:
        model(x)
    except RuntimeError:
        pass
    else:
        raise AssertionError("eager no longer raises: the premise of this case changed")
    try:
        result = torch.compile(model)(x)
    except RuntimeError:
        return
    raise AssertionError(f"compiled returned {result.dtype} {tuple(result.shape)} instead of raising")


if __name__ == "__main__":
    test_pt_141865_linear_mixed_dtype_accepted()
