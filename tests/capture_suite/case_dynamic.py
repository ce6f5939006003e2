"""(h) A model compiled with dynamic shapes (`torch.compile(dynamic=True)`, as LLM workloads
compile) that hits inductor's relu bug: the capture keeps its symbolic dims."""

import torch


class ScaledRelu(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * x.shape[-1]).cos()


@torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"})
def test_dynamic_model_compiles() -> None:
    torch.compile(ScaledRelu(), dynamic=True)(torch.randn(3, 6))
