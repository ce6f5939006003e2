"""The corpus's models and what a generated test does with one (bench/corpus.py, corpus_cases.py).

`run_case(architecture, mode)` is the body of every generated test: build the model (random
weights, seeded), compile it the way the mode says, call it, and in training mode step backward,
with inductor's relu bug injected. `check_architecture` is the harness's quick in-process check
that an architecture builds, runs eagerly and has a relu; `describe_program` reads a .pt2 for the
harness (its ops and its dynamic dims). Imports torch; transformers only where a model needs it.
"""

from __future__ import annotations

import importlib
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from corpus_cases import BUG_BY_MODE, BUG_KEY, BY_NAME, Architecture
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from zoo import BasicBlock  # the zoo's ResNet block

BATCH, SEQUENCE, IMAGE, AUDIO = 2, 8, 32, 400
# Set by the harness for torch's side only: torch's after_aot writes each case's
# minifier_launcher.py under DIR/<case> (its debug dir is one per process otherwise).
TORCH_DEBUG_ROOT = "CORPUS_TORCH_DEBUG_ROOT"


# --- the hand-built nets ------------------------------------------------------------------------


class ResNetBN(nn.Module):
    """A small ResNet: stem, two basic blocks with batch norm and a strided shortcut, mean pool, linear."""

    def __init__(self, width: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.block1 = BasicBlock(width, width, 1)
        self.block2 = BasicBlock(width, 2 * width, 2)
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        features = self.block2(self.block1(self.stem(pixel_values)))
        return self.fc(features.mean((2, 3)))


class DepthwiseNet(nn.Module):
    """MobileNet-style: a stem, inverted residual blocks (1x1 expand, 3x3 depthwise, 1x1 project,
    batch norm, relu), mean pool, linear."""

    def __init__(self, width: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 2, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.blocks = nn.Sequential(_InvertedResidual(width, width, 1), _InvertedResidual(width, 2 * width, 2))
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.fc(self.blocks(self.stem(pixel_values)).mean((2, 3)))


class _InvertedResidual(nn.Module):
    def __init__(self, inputs: int, outputs: int, stride: int, expand: int = 2) -> None:
        super().__init__()
        hidden = inputs * expand
        self.layers = nn.Sequential(
            nn.Conv2d(inputs, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU(),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False), nn.BatchNorm2d(hidden), nn.ReLU(),
            nn.Conv2d(hidden, outputs, 1, bias=False), nn.BatchNorm2d(outputs),
        )
        self.residual = stride == 1 and inputs == outputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.layers(x)
        return x + y if self.residual else y


# --- building a case's model and inputs ---------------------------------------------------------


def _text() -> dict[str, torch.Tensor]:
    ids = torch.randint(3, 64, (BATCH, SEQUENCE))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _seq2seq() -> dict[str, torch.Tensor]:
    return {**_text(), "decoder_input_ids": torch.randint(3, 64, (BATCH, SEQUENCE))}


INPUTS = {
    "text": _text,
    "seq2seq": _seq2seq,
    "image": lambda: {"pixel_values": torch.randn(BATCH, 3, IMAGE, IMAGE)},
    "audio": lambda: {"input_values": torch.randn(BATCH, AUDIO)},
    "mel": lambda: {"input_features": torch.randn(BATCH, 16, 16),
                    "decoder_input_ids": torch.randint(3, 64, (BATCH, SEQUENCE))},
}


def build(architecture: Architecture) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """The model, random weights (seeded), and its inputs as keyword arguments."""
    torch.manual_seed(0)
    module_name, _, class_name = architecture.model.replace(":", ".").rpartition(".")
    model_class = getattr(importlib.import_module(module_name), class_name)
    if module_name == "transformers":
        config = model_class.config_class(**architecture.config, **architecture.relu)
        model = model_class(config)
    else:
        model = with_batch_norm_statistics(model_class())
    return model, INPUTS[architecture.inputs]()


def with_batch_norm_statistics(model: nn.Module) -> nn.Module:
    """The hand-built nets with the batch-norm statistics of random images, as a trained net has
    them (zoo.with_batch_norm_statistics: without them activations shrink layer by layer and the
    wrong-values bug does not show at the output)."""
    from zoo import with_batch_norm_statistics as statistics

    return statistics(model, IMAGE)


def first_tensor(output: Any) -> torch.Tensor:
    """The model's first output tensor (a ModelOutput's first field, a tuple's first item)."""
    if isinstance(output, torch.Tensor):
        return output
    values = output.values() if isinstance(output, dict) else output
    for value in values:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value
    raise TypeError(f"no floating-point tensor in the model's output ({type(output).__name__})")


def run_case(architecture: str, mode: str) -> None:
    """What a generated test does: compile the model as the mode says and run it, with inductor's
    relu bug injected (`compile_error` raises here; `accuracy` computes wrong values silently)."""
    torch._dynamo.reset()
    debug_root = os.environ.get(TORCH_DEBUG_ROOT)
    if debug_root:
        torch._dynamo.config.debug_dir_root = str(Path(debug_root) / f"{architecture}-{mode}")
    model, inputs = build(BY_NAME[architecture])
    with torch._inductor.config.patch({BUG_KEY: BUG_BY_MODE[mode]}):
        compiled = torch.compile(model, dynamic=True if mode == "dynamic" else None)
        if mode == "training":
            model.train()
            first_tensor(compiled(**inputs)).float().mean().backward()
        else:
            model.eval()
            with torch.no_grad():
                compiled(**inputs)


# --- the harness's checks -----------------------------------------------------------------------


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def check_architecture(name: str) -> dict[str, Any]:
    """Build the model, run it eagerly in eval mode, count its aten ops, and take an eager training
    step as the training mode does: `{"relus", "ops", "error"}`."""
    try:
        model, inputs = build(BY_NAME[name])
        counter = _OpCounter()
        with torch.no_grad(), counter:
            model.eval()(**inputs)
        first_tensor(model.train()(**inputs)).float().mean().backward()
    except Exception as error:  # the check reports every architecture, it does not stop on one
        return {"relus": 0, "ops": 0, "error": f"{type(error).__name__}: {error}"}
    relus = counter.ops["relu"] + counter.ops["relu_"]
    return {"relus": relus, "ops": sum(counter.ops.values()), "error": None}


def describe_program(path: Path) -> dict[str, Any]:
    """A saved program's aten ops (by name, `call_function` nodes) and its dynamic dims
    (`range_constraints`: the symbols the program keeps symbolic); `{"error"}` when it cannot be
    loaded. Loaded as the worker loads it (`export_load`: transformers' output types need no
    import), with the custom-op modules a capture's spec.json beside it names (MoE models)."""
    from minify_worker.programs.fx.export_load import load

    spec = path.parent / "spec.json"
    for module in json.loads(spec.read_text()).get("op_modules", []) if spec.exists() else []:
        importlib.import_module(module)
    try:
        program = load(path)
    except Exception as error:  # one program that cannot load must not hide the others' dims
        return {"error": f"{type(error).__name__}: {error}"[:600]}
    ops = [_op_name(node.target) for node in program.graph.nodes if node.op == "call_function"]
    dynamic = sorted(str(symbol) for symbol in program.range_constraints)
    return {"ops": ops, "dynamic_dims": dynamic}


def _op_name(target: Any) -> str:
    """`aten.relu.default` -> `relu`; `operator.getitem` -> `getitem`."""
    packet = getattr(target, "overloadpacket", None)
    return packet.__name__ if packet is not None else getattr(target, "__name__", str(target))
