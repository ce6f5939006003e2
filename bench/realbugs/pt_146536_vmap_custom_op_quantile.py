"""A custom op with its own vmap rule (quantile over the last dim), vmapped and compiled: not what eager gives.

issue:    https://github.com/pytorch/pytorch/issues/146536
checks:   compiled `vmap(lambda x: vquantile(x, q))` equals the uncompiled vmap; the issue saw silently wrong
          values, on 2.13.0 inductor's own size/stride assertion on the op's output catches the same mismatch
          between the fake and the real kernel (`AssertionError: expected size 3==3, stride 1==2`)
fails on: 2.13.0+cpu (checked here); the issue: 2.6, CPU
kind:     runtime error
feature:  custom ops (register_vmap, register_fake), functorch transforms (vmap)
"""

import torch


@torch.library.custom_op("realbugs::vquantile", mutates_args=())
def vquantile(x: torch.Tensor, q: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return torch.quantile(x, q, dim)


@vquantile.register_fake
def _(x: torch.Tensor, q: torch.Tensor, dim: int = -1) -> torch.Tensor:
    picked = x.index_select(dim, torch.zeros(q.numel(), dtype=torch.int64)).squeeze(dim)
    return torch.empty_like(picked)


@vquantile.register_vmap
def _(info, in_dims, x, q, dim=-1):
    result = vquantile(x.movedim(in_dims[0], -1), q, dim % (x.ndim - 1))
    return result, result.ndim - 1


def test_pt_146536_vmap_custom_op_quantile() -> None:
    a = torch.arange(10.0).reshape(2, 5)
    q = torch.tensor([0.2, 0.5, 0.8])
    batched = torch.vmap(lambda x: vquantile(x, q, -1))
    expected = batched(a)
    actual = torch.compile(batched)(a)
    assert actual.shape == expected.shape and torch.allclose(actual, expected), (
        f"compiled {actual.tolist()} != eager {expected.tolist()}")


if __name__ == "__main__":
    test_pt_146536_vmap_custom_op_quantile()
