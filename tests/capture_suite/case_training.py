"""(g) A training step whose backward graph fails to compile: the forward compiles, the backward
(which has the relu, from a custom autograd.Function) hits inductor's relu bug at loss.backward()."""

import torch


class ReluInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return torch.relu(grad) * x


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ReluInBackward.apply(self.linear(x)).sum()


@torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"})
def test_training_step() -> None:
    torch.manual_seed(0)
    net = Net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    loss = torch.compile(net)(torch.randn(3, 6))
    loss.backward()
    optimizer.step()
