"""An out-of-range index computed in the graph, compiled on CPU: the kernel's bounds check throws inside a
parallel region and the process aborts ("terminate called after throwing an instance of 'c10::Error'").

issue:    https://github.com/pytorch/pytorch/issues/126691
checks:   compiled `a[arange(1, -a.numel() - 1, -1)]` raises an IndexError/RuntimeError as eager does
fails on: 2.13.0+cpu (checked here); the issue: 2.4 nightly, CPU
kind:     crash
feature:  inductor C++ kernels (bounds checks inside OpenMP regions)
"""

import torch


def gather_backwards(a: torch.Tensor) -> torch.Tensor:
    index = torch.arange(start=1, end=-a.numel() - 1, step=-1, device=a.device)
    return a[index]


def test_pt_126691_index_check_terminate() -> None:
    x = torch.rand(1024, 128)
    try:
        gather_backwards(x)
    except (IndexError, RuntimeError):
        pass
    else:
        raise AssertionError("eager no longer raises: the premise of this case changed")
    try:
        torch.compile(gather_backwards)(x)
    except (IndexError, RuntimeError):
        return
    raise AssertionError("compiled returned instead of raising")


if __name__ == "__main__":
    test_pt_126691_index_check_terminate()
