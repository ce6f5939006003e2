"""(c) An AOTInductor package build that fails on inductor's relu bug, of the most common module
as users export it: an `nn.Sequential` (its forward's argument is named `input`, a builtin)."""

import torch


class Cos(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cos(x)


def test_aoti_package_builds(tmp_path) -> None:
    program = torch.export.export(torch.nn.Sequential(torch.nn.ReLU(), Cos()), (torch.randn(4, 4),))
    torch._inductor.aoti_compile_and_package(
        program, package_path=str(tmp_path / "model.pt2"),
        inductor_configs={"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"})
