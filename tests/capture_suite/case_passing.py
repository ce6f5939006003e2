"""(e) Compiles that pass: their tests stay as they are, and nothing is captured."""

import torch


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def test_inductor_compile_matches_eager() -> None:
    model, x = Mlp(), torch.randn(4, 8)
    torch.testing.assert_close(torch.compile(model)(x), model(x))


def test_a_failing_assertion_stays_the_tests_own() -> None:
    model = Mlp()
    out = torch.compile(model, backend="aot_eager")(torch.randn(4, 8))
    assert out.shape == (4, 3), "the test's own assertion"
