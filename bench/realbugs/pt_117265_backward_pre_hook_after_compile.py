"""A full backward pre-hook registered on a module after its first compiled call is ignored by the next backward.

issue:    https://github.com/pytorch/pytorch/issues/117265
checks:   a compiled (fullgraph) function calling an identity Linear(3, 3); after one call, a
          register_full_backward_pre_hook doubling grad_output is added; the next call's x.grad equals eager's
          [2., 2., 2.]; compiled gives [1., 1., 1.] (no recompile, the hook never runs)
fails on: 2.13.0+cpu (checked here); the issue: nightly 2024 (aot_eager), open
kind:     wrong values (float)
feature:  dynamo guards on nn.Module hooks (backward pre-hook added after compilation), training (backward),
          no graph holds the bug
"""

import torch


def grad_after_hook(compiled: bool) -> torch.Tensor:
    layer = torch.nn.Linear(3, 3, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.eye(3))

    def project(x: torch.Tensor) -> torch.Tensor:
        return layer(x)

    run = torch.compile(project, fullgraph=True) if compiled else project
    run(torch.ones(3, requires_grad=True))
    layer.register_full_backward_pre_hook(lambda module, grad_output: tuple(g * 2 for g in grad_output))
    x = torch.ones(3, requires_grad=True)
    run(x).sum().backward()
    return x.grad


def test_pt_117265_backward_pre_hook_after_compile() -> None:
    expected = grad_after_hook(compiled=False)
    actual = grad_after_hook(compiled=True)
    assert torch.equal(actual, expected), f"compiled grad {actual.tolist()} != eager {expected.tolist()}"


if __name__ == "__main__":
    test_pt_117265_backward_pre_hook_after_compile()
