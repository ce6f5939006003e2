"""A nested_compile_region reading a global that the caller rebinds each iteration: the region reuses the first value.

issue:    https://github.com/pytorch/pytorch/issues/191821
checks:   compiled (eager backend, fullgraph) loop that rebinds a global before calling the region twice gives 2
fails on: 2.13.0+cpu (checked here); the issue: 2.14 nightly (2026-08)
kind:     wrong values (integer)
feature:  higher-order ops (nested_compile_region / invoke_subgraph), dynamo side effects
"""

from dataclasses import dataclass

import torch


@dataclass
class RegionInput:
    hidden: torch.Tensor


region_input = RegionInput(torch.tensor(0))


@torch.compiler.nested_compile_region
def region() -> torch.Tensor:
    return region_input.hidden + 1


def step_twice(hidden: torch.Tensor) -> torch.Tensor:
    global region_input
    for _ in range(2):
        region_input = RegionInput(hidden)
        hidden = region()
    return hidden


def test_pt_191821_nested_region_global_mutation() -> None:
    expected = step_twice(torch.tensor(0))
    actual = torch.compile(step_twice, backend="eager", fullgraph=True)(torch.tensor(0))
    assert torch.equal(actual, expected), f"compiled {actual.item()} != eager {expected.item()}"


if __name__ == "__main__":
    test_pt_191821_nested_region_global_mutation()
