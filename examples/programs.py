"""Failing programs used by the examples, the tests and the benchmark.

Each builder returns `(ExportedProgram, inputs)` where inputs is `(args, kwargs)` as the program
was exported with. Run this file to write them as .pt2 files: `python examples/programs.py DIR`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

Inputs = tuple[tuple, dict]


class ReluCos(torch.nn.Module):
    """The seed's `_test_after_aot` program: relu then cos."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cos(torch.relu(x))


class AccuracyVsStrict(torch.nn.Module):
    """The seed's `test_accuracy_vs_strict_accuracy` program."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.log1p(x)
        b = y > 0
        b = torch.logical_not(b)
        b = torch.logical_not(b)
        x = torch.relu(x)
        return torch.where(b, x, x)


class LinearReluSigmoid(torch.nn.Module):
    """The seed's `_test_aoti` program."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(10, 16)
        self.relu = torch.nn.ReLU()
        self.sigmoid = torch.nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.sigmoid(self.relu(self.fc1(x)))


class LinearReluSigmoidDict(LinearReluSigmoid):
    """The seed's `_test_aoti_unflattened_inputs` program: dict input and a keyword input."""

    def forward(self, inp: dict[str, torch.Tensor], *, k: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        x = self.fc1(inp["x"])
        y = self.fc1(inp["y"])
        k = self.fc1(k)
        x = self.sigmoid(self.relu(x))
        return x + y + k


class Chain(torch.nn.Module):
    """A longer elementwise chain for strategy and scheduler tests: sin, relu, cos, exp, tanh, ..."""

    def __init__(self, ops: tuple[str, ...] = ("sin", "relu", "cos", "exp", "tanh", "sigmoid", "neg", "abs")):
        super().__init__()
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name in self.ops:
            x = getattr(torch, name)(x)
        return x


def relu_cos(device: str = "cpu") -> tuple[torch.export.ExportedProgram, Inputs]:
    args = (torch.randn(20, 20, device=device),)
    return torch.export.export(ReluCos(), args), (args, {})


def accuracy_vs_strict() -> tuple[torch.export.ExportedProgram, Inputs]:
    args = (torch.randn(20),)
    return torch.export.export(AccuracyVsStrict(), args), (args, {})


def linear_relu_sigmoid() -> tuple[torch.export.ExportedProgram, Inputs]:
    torch.manual_seed(0)
    args = (torch.randn(8, 10),)
    with torch.no_grad():
        return torch.export.export(LinearReluSigmoid(), args), (args, {})


def linear_relu_sigmoid_dict() -> tuple[torch.export.ExportedProgram, Inputs]:
    torch.manual_seed(0)
    val = torch.randn(8, 10)
    args = ({"x": val.clone(), "y": val.clone()},)
    kwargs = {"k": val.clone()}
    with torch.no_grad():
        return torch.export.export(LinearReluSigmoidDict(), args, kwargs), (args, kwargs)


def chain(ops: tuple[str, ...] | None = None) -> tuple[torch.export.ExportedProgram, Inputs]:
    args = (torch.randn(4, 4),)
    module = Chain(ops) if ops else Chain()
    return torch.export.export(module, args), (args, {})


def transformer_layer(layers: int = 1, device: str = "cpu") -> tuple[torch.export.ExportedProgram, Inputs]:
    """nn.TransformerEncoderLayer (fast path off), `layers` of them stacked; relu activation; built
    and exported on `device` (the graph then creates what it creates there)."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0,
                                             batch_first=True)
    module: torch.nn.Module = (
        torch.nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)
        if layers > 1 else layer
    )
    module.eval().to(device)
    args = (torch.randn(2, 8, 32, device=device),)
    prior = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad():
            return torch.export.export(module, args), (args, {})
    finally:
        torch.backends.mha.set_fastpath_enabled(prior)


BUILDERS = {
    "relu_cos": relu_cos,
    "accuracy_vs_strict": accuracy_vs_strict,
    "linear_relu_sigmoid": linear_relu_sigmoid,
    "linear_relu_sigmoid_dict": linear_relu_sigmoid_dict,
    "chain": chain,
    "transformer_layer": transformer_layer,
}


def save(name: str, directory: Path) -> Path:
    """Write program `name` as DIR/NAME.pt2 (its example inputs travel inside the archive)."""
    ep, _ = BUILDERS[name]()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.pt2"
    torch.export.save(ep, path)
    return path


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "examples")
    for builder_name in BUILDERS:
        print(save(builder_name, target))
