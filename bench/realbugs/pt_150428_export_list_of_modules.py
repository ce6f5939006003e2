"""Strict torch.export of a module that keeps its submodules in a plain Python list: export fails with a KeyError.

issue:    https://github.com/pytorch/pytorch/issues/150428
checks:   `torch.export.export(Chain(), (x,), strict=True).module()(x)` equals eager `Chain()(x)`, Chain applying
          two parameterised submodules held in a list (not a ModuleList)
fails on: 2.13.0+cpu (checked here); the issue: nightly 2.8
kind:     compile error
feature:  torch.export (strict, dynamo tracing), parameter/buffer naming of submodules outside a ModuleList
"""

import torch


class Shift(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.offset = torch.nn.Parameter(torch.full((2, 3), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.offset


class Chain(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stages = [Shift(), Shift()]  # a plain list: the stages are not registered submodules

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage in self.stages:
            x = stage(x)
        return x


def test_pt_150428_export_list_of_modules() -> None:
    x = torch.ones(2, 3)
    model = Chain()
    expected = model(x)
    exported = torch.export.export(model, (x,), strict=True)
    actual = exported.module()(x)
    assert torch.equal(actual, expected), f"exported {actual.tolist()} != eager {expected.tolist()}"


if __name__ == "__main__":
    test_pt_150428_export_list_of_modules()
