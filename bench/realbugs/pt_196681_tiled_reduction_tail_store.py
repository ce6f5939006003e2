"""A matmul of two padded views of a channels-last GELU, compiled on CPU: the 2-D tiled reduction writes a
full vector in its tail block, past the end of its output, and the process aborts ("free(): invalid pointer").

issue:    https://github.com/pytorch/pytorch/issues/196681
checks:   compiled `matmul(pad(gelu(x)), pad(gelu(x).permute(3, 2, 1, 0)))` of a channels-last float32
          (1, 8, 66, 66) input equals eager's (1, 66, 66, 66) result within float tolerance
fails on: 2.13.0+cpu (checked here: SIGABRT in every run, "free(): invalid pointer" or "corrupted size vs.
          prev_size", in some runs after assert_close reports 21% of the elements off by up to 20); the issue:
          nightly, CPU (heap corruption or silently wrong rows, where 66 is not a multiple of the vector width)
kind:     crash
feature:  inductor C++ kernels (2-D tiled reduction, masked tail of the tiled dim, vectorized store)
"""

import torch
import torch.nn.functional as F


def padded_gelu_matmul(x: torch.Tensor) -> torch.Tensor:
    g = (x * 0.5) * (torch.erf(x * 0.7071067811865476) + 1)
    right = F.pad(g.permute(3, 2, 1, 0), (0, 0, 0, 58), value=0.5)
    left = F.pad(g, (0, 0, 0, 0, 0, 58), value=0.5)
    return torch.matmul(left, right)


def test_pt_196681_tiled_reduction_tail_store() -> None:
    torch.manual_seed(0)
    x = torch.randn(1, 8, 66, 66).contiguous(memory_format=torch.channels_last)
    expected = padded_gelu_matmul(x)
    actual = torch.compile(padded_gelu_matmul)(x)
    torch.testing.assert_close(actual, expected)


if __name__ == "__main__":
    test_pt_196681_tiled_reduction_tail_store()
