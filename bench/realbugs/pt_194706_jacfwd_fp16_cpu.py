"""jacfwd of a small fp16 matmul chain under torch.compile: inductor's CPU backend fails to compile it.

issue:    https://github.com/pytorch/pytorch/issues/194706
checks:   compiled `jacfwd(f)` on a 3x3 fp16 input runs
fails on: 2.13.0+cpu (checked here); the issue: 2026-08, CPU
kind:     compile error
feature:  functorch transforms (jacfwd), fp16 on CPU
"""

import torch


def chain(x: torch.Tensor) -> torch.Tensor:
    return torch.sum(torch.mm(torch.mm(torch.prod(x) + x, torch.sum(x) + x), torch.sum(x) + x))


def test_pt_194706_jacfwd_fp16_cpu() -> None:
    x = (torch.arange(1, 10, dtype=torch.float16) / 10).reshape(3, 3)
    torch.compile(torch.func.jacfwd(chain))(x)


if __name__ == "__main__":
    test_pt_194706_jacfwd_fp16_cpu()
