"""Programs torch.export.save cannot write, as program.json: the capture's writer
(`minify_client.capture.program_file.as_program_json`) over a program exported in memory."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._higher_order_ops.while_loop import while_loop

from minify_client.capture.program_file import as_program_json


class ReluInIntLoop(torch.nn.Module):
    """A while_loop whose state holds a Python int (the count), relu in its body, with a buffer (a
    loop's carry that requires grad is refused by torch.export: "all carried_inputs must be tensors")."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 8))

    def forward(self, x: torch.Tensor) -> tuple[Any, ...]:
        def more(i: int, value: torch.Tensor) -> Any:
            return i < 3

        def body(i: int, value: torch.Tensor) -> tuple[Any, torch.Tensor]:
            return i + 1, torch.relu(value.cos()).sub(0.5)

        count, value = while_loop(more, body, (0, x.sin() * self.scale))
        return count, value.exp()


def unsavable(module: torch.nn.Module, *inputs: torch.Tensor) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """`module` exported (which torch.export.save refuses to write, or torch.export.load to read
    back: checked), as program.json's document and its values by placeholder name."""
    program = torch.export.export(module, inputs)
    buffer = io.BytesIO()
    with pytest.raises(Exception):  # noqa: B017 (torch's serializer raises what it raises)
        torch.export.save(program, buffer)
        torch.export.load(io.BytesIO(buffer.getvalue()))
    document, values = as_program_json(program, inputs, {}, why="torch.export.save cannot write it (test)")
    return program, document, values


def write(folder: Path, document: dict[str, Any], values: Any) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "program.json").write_text(json.dumps(document))
    torch.save(values, folder / "inputs.pt")
    return folder / "program.json", folder / "inputs.pt"
