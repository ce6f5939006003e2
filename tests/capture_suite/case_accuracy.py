"""(d) A compiled graph that runs but computes the wrong thing (inductor's relu accuracy bug): the
test passes, and with MINIFY_CAPTURE_ACCURACY=1 the graph is captured as an accuracy failure."""

import torch


class ReluSin(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(torch.relu(x)) * 3


@torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "accuracy"})
def test_wrong_values_go_unnoticed_by_the_test() -> None:
    torch.compile(ReluSin())(torch.randn(4, 4))
