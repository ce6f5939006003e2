"""(a) A model torch.compile handles with graph breaks (a data-dependent branch, a print) whose
second graph hits inductor's relu bug; and the same model in a documented capture_failures block."""

import os

import torch

from minify_client.capture import capture_failures


class GraphBreaks(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        if y.sum().item() > 0:  # data-dependent: graph break
            y = y * 2
        print("between the graphs")  # graph break
        return torch.relu(y).cos()


@torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"})
def test_graph_breaks_model_compiles() -> None:
    torch.manual_seed(0)
    model = GraphBreaks()
    torch.compile(model)(torch.randn(4, 8))


@torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"})
def test_graph_breaks_model_in_a_capture_block() -> None:
    torch.manual_seed(0)
    model, x = GraphBreaks(), torch.randn(4, 8)
    with capture_failures(model, (x,), save_to=os.path.join(os.environ["MINIFY_CAPTURE_DIR"], "block")):
        torch.compile(model)(x)
