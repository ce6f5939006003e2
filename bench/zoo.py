"""The model zoo: real architectures with random weights, built here (nothing is downloaded).

Two kinds of model. Written by hand, small but complete, for where torchvision and transformers do
not install (beside this project's torch 2.13 CPU build): a ResNet (convolutions, batch norm,
relu, pooling, a softmax head), a BERT encoder (word, position and type embeddings,
self-attention, layer norms, gelu, a tanh pooler) and a GPT-2 decoder (causal self-attention,
pre-norm blocks, gelu, a tied LM head with a softmax). And the real ones, from their libraries'
constructors and configs (`REAL_MODELS`: torchvision's ResNet-18 and MobileNetV3-small,
transformers' BertModel and GPT2LMHeadModel, small configs), where those libraries import
(`missing_library`). Each is exported with `torch.export.export` in eval mode.

A zoo case is a model and a failure (`FAILURES`): the relu bugs of inductor's C++ backend, a
compile error and wrong results (models with a relu), a backend that fails only when two ops of
different kinds are in one graph (tests/support/backends.py), and a backend that computes softmax
wrong (an accuracy bug).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from common import RELU_COMPILE_SIGNATURE
from torch import nn
from torch.nn import functional as F

# --- models ------------------------------------------------------------------------------------


class BasicBlock(nn.Module):
    def __init__(self, inputs: int, outputs: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet-18's layout at a quarter of its width, one block per stage: 4 stages, 10 convolutions."""

    def __init__(self, width: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        stages, channels = [], width
        for index in range(4):
            outputs = width * 2**index
            stages.append(BasicBlock(channels, outputs, 1 if index == 0 else 2))
            channels = outputs
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.stages(self.stem(x)).mean((2, 3))
        return self.fc(features).softmax(-1)


@dataclass
class TransformerConfig:
    vocab: int = 128
    positions: int = 32
    hidden: int = 32
    heads: int = 4
    layers: int = 2
    intermediate: int = 64


class SelfAttention(nn.Module):
    def __init__(self, config: TransformerConfig, causal: bool) -> None:
        super().__init__()
        self.heads = config.heads
        self.query = nn.Linear(config.hidden, config.hidden)
        self.key = nn.Linear(config.hidden, config.hidden)
        self.value = nn.Linear(config.hidden, config.hidden)
        self.out = nn.Linear(config.hidden, config.hidden)
        self.causal = causal

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, length, self.heads, hidden // self.heads).transpose(1, 2)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(hidden // self.heads) + mask
        if self.causal:
            scores = scores.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), float("-inf"))
        context = scores.softmax(-1) @ v
        return self.out(context.transpose(1, 2).reshape(batch, length, hidden))


class BertLayer(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.attention = SelfAttention(config, causal=False)
        self.attention_norm = nn.LayerNorm(config.hidden)
        self.intermediate = nn.Linear(config.hidden, config.intermediate)
        self.output = nn.Linear(config.intermediate, config.hidden)
        self.output_norm = nn.LayerNorm(config.hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.attention_norm(x + self.attention(x, mask))
        return self.output_norm(x + self.output(F.gelu(self.intermediate(x))))


class Bert(nn.Module):
    """BERT-base's layout, small: embeddings + layer norm, post-norm encoder layers, tanh pooler."""

    def __init__(self, config: TransformerConfig | None = None) -> None:
        super().__init__()
        config = config or TransformerConfig()
        self.words = nn.Embedding(config.vocab, config.hidden)
        self.positions = nn.Embedding(config.positions, config.hidden)
        self.types = nn.Embedding(2, config.hidden)
        self.norm = nn.LayerNorm(config.hidden)
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.layers))
        self.pooler = nn.Linear(config.hidden, config.hidden)

    def forward(self, ids: torch.Tensor, types: torch.Tensor, attention: torch.Tensor) -> tuple[torch.Tensor, ...]:
        positions = torch.arange(ids.shape[1]).unsqueeze(0)
        x = self.norm(self.words(ids) + self.positions(positions) + self.types(types))
        mask = (1.0 - attention[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, mask)
        return x, torch.tanh(self.pooler(x[:, 0]))


class Gpt2Block(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.hidden)
        self.attention = SelfAttention(config, causal=True)
        self.norm2 = nn.LayerNorm(config.hidden)
        self.up = nn.Linear(config.hidden, config.intermediate)
        self.down = nn.Linear(config.intermediate, config.hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x), mask)
        return x + self.down(F.gelu(self.up(self.norm2(x)), approximate="tanh"))


class Gpt2(nn.Module):
    """GPT-2's layout, small: token + position embeddings, pre-norm causal blocks, final norm,
    LM head tied to the token embedding, next-token probabilities."""

    def __init__(self, config: TransformerConfig | None = None) -> None:
        super().__init__()
        config = config or TransformerConfig()
        self.tokens = nn.Embedding(config.vocab, config.hidden)
        self.positions = nn.Embedding(config.positions, config.hidden)
        self.blocks = nn.ModuleList(Gpt2Block(config) for _ in range(config.layers))
        self.norm = nn.LayerNorm(config.hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1]).unsqueeze(0))
        mask = torch.zeros(1, 1, ids.shape[1], ids.shape[1])
        for block in self.blocks:
            x = block(x, mask)
        return (self.norm(x) @ self.tokens.weight.t()).softmax(-1)


def _token_inputs(length: int = 16) -> tuple[torch.Tensor, ...]:
    return (torch.randint(0, 128, (2, length)),)


def _bert_inputs() -> tuple[torch.Tensor, ...]:
    """Token ids, token types (all 0), attention mask (all 1): the hand-written Bert's order."""
    return (*_token_inputs(), torch.zeros(2, 16, dtype=torch.long), torch.ones(2, 16, dtype=torch.long))


def _hf_bert_inputs() -> tuple[torch.Tensor, ...]:
    """Token ids, attention mask (all 1), token types (all 0): BertModel's order."""
    return (*_token_inputs(), torch.ones(2, 16, dtype=torch.long), torch.zeros(2, 16, dtype=torch.long))


def _image_inputs(size: int) -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 3, size, size),)


# --- real models (torchvision, transformers) ---------------------------------------------------


class Probabilities(nn.Module):
    """A classifier with a softmax on its logits, as at inference: torchvision's models end on
    logits, and the softmax accuracy case needs a softmax."""

    def __init__(self, classifier: nn.Module) -> None:
        super().__init__()
        self.classifier = classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(x).softmax(-1)


def tv_resnet18() -> nn.Module:
    """torchvision's ResNet-18 as constructed (11.7 M parameters, 1000 classes), random weights."""
    import torchvision

    return Probabilities(torchvision.models.resnet18(weights=None))


def with_batch_norm_statistics(model: nn.Module, image_size: int, batches: int = 8) -> nn.Module:
    """`model` with the batch-norm statistics of random images, as a trained model has them for
    its data: each batch norm normalizes what reaches it.

    As constructed, every running mean is 0 and every variance 1, so in eval mode a batch norm
    passes its input through; MobileNetV3-small's activations then shrink layer by layer to logits
    of about 1e-10, and no error before them shows at the output (a relu that computes x + 1 changed
    them by 5e-7: both minifiers found the original passing the accuracy check, tolerance 1e-3).
    """
    norms = [module for module in model.modules() if isinstance(module, nn.modules.batchnorm._BatchNorm)]
    momenta = [norm.momentum for norm in norms]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average over the batches
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(8, 3, image_size, image_size))
    for norm, momentum in zip(norms, momenta, strict=True):
        norm.momentum = momentum  # the program exports as the model was constructed, only the statistics differ
    return model.eval()


def tv_mobilenet_v3_small() -> nn.Module:
    """torchvision's MobileNetV3-small as constructed (hardswish, squeeze-excitation), random weights,
    batch-norm statistics of random 64x64 images (`with_batch_norm_statistics`)."""
    import torchvision

    return Probabilities(with_batch_norm_statistics(torchvision.models.mobilenet_v3_small(weights=None), 64))


class Tuples(nn.Module):
    """A transformers model that returns a tuple: its output classes are pytree nodes that
    `torch.export.load` cannot rebuild where transformers has not registered them for serialization."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.model(*inputs).to_tuple()


def hf_bert() -> nn.Module:
    """transformers' BertModel from a small BertConfig: 2 layers, hidden 64, 2 heads, vocabulary 128.

    Attention is the model's own ("eager": matmul, mask, softmax), as for GPT-2 below.
    """
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=32, attn_implementation="eager")
    return Tuples(BertModel(config))


def hf_gpt2() -> nn.Module:
    """transformers' GPT2LMHeadModel from a small GPT2Config: 2 blocks, 64 wide, 2 heads, vocabulary 128.

    The last token is begin and end of text (GPT-2's 50256 is outside this vocabulary). No KV cache
    (export cannot return transformers' DynamicCache) and the model's own attention
    ("eager"): with "sdpa", torch 2.14.1's core-aten decomposition of the exported program fails
    ("Cannot view a tensor with shape [2, 16, 64] and strides (64, 128, 1)").
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=2, n_head=2, use_cache=False,
                        bos_token_id=127, eos_token_id=127, attn_implementation="eager")
    return Tuples(GPT2LMHeadModel(config))


MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[], tuple[Any, ...]]]] = {
    "resnet": (ResNet, lambda: _image_inputs(32)),
    "bert": (Bert, _bert_inputs),
    "gpt2": (Gpt2, _token_inputs),
    "tv_resnet18": (tv_resnet18, lambda: _image_inputs(64)),
    "tv_mobilenet_v3_small": (tv_mobilenet_v3_small, lambda: _image_inputs(64)),
    "hf_bert": (hf_bert, _hf_bert_inputs),
    "hf_gpt2": (hf_gpt2, _token_inputs),
}

# The library each real model is built with.
REAL_MODELS = {"tv_resnet18": "torchvision", "tv_mobilenet_v3_small": "torchvision",
               "hf_bert": "transformers", "hf_gpt2": "transformers"}


def missing_library(model: str) -> str | None:
    """Why `model` cannot be built here (its library does not import), or None when it can."""
    library = REAL_MODELS.get(model)
    if library is None:
        return None
    try:
        importlib.import_module(library)
    except Exception as error:  # torchvision beside a torch it was not built for raises more than ImportError
        return f"{library} does not import ({type(error).__name__}: {error})"
    return None


def decomposed(program: torch.export.ExportedProgram, table: str) -> torch.export.ExportedProgram:
    """`cases.decomposed`, with inductor's table applied in a second pass, after core aten.

    One table holding both loops on clamp (inductor's clamp decomposes to clamp_min, core aten's
    clamp_min back to clamp): MobileNetV3's hardswish hits it (RecursionError). In two passes the
    programs of the other models come out the same as with one table.
    """
    from cases import decomposed as decomposed_in_one_pass

    if table != "inductor":
        return decomposed_in_one_pass(program, table)
    from torch._inductor.decomposition import select_decomp_table

    importlib.import_module("torch._inductor.lowering")  # its max-pool decomposition asks the lowering module

    return program.run_decompositions().run_decompositions(select_decomp_table())


def export_model(name: str, table: str) -> torch.export.ExportedProgram:
    """The model with random weights (seeded), in eval mode, exported and decomposed (`decomposed`)."""
    torch.manual_seed(0)
    build, inputs = MODELS[name]
    with torch.no_grad():
        program = torch.export.export(build().eval(), inputs())
    return decomposed(program, table)


# --- failures ----------------------------------------------------------------------------------

TESTING = "tests.support.backends"


@dataclass(frozen=True)
class Failure:
    """How a zoo case fails: the backend both minifiers use and what counts as still failing."""

    name: str
    backend: str  # "inductor" or a testing backend's name
    kind: str  # the job spec's failure kind
    table: str  # decomposition table of the program (cases.decomposed)
    config: dict[str, Any] = field(default_factory=dict)
    expected_ops: int | None = None  # the smallest answer there is, when known
    needs: str = ""  # an op every model of the case must have
    signature: str | None = None  # what the original fails with, as a capture records it (two_ops: by model)


FAILURES: dict[str, Failure] = {
    "relu_compile": Failure("relu_compile", "inductor", "compile_error", "inductor",
                            {"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}, expected_ops=1, needs="relu",
                            signature=RELU_COMPILE_SIGNATURE),
    # Inductor's C++ relu computes x + 1: the program compiles and runs, its results are wrong
    # (torch's side: after_aot's accuracy check against fp64; ours: failure kind accuracy).
    "relu_accuracy": Failure("relu_accuracy", "inductor", "accuracy", "inductor",
                             {"cpp.inject_relu_bug_TESTING_ONLY": "accuracy"}, expected_ops=1, needs="relu",
                             signature="AccuracyError"),
    "two_ops": Failure("two_ops", "", "compile_error", "core", expected_ops=2),  # backend: TWO_OPS
    "softmax_accuracy": Failure("softmax_accuracy", f"{TESTING}:wrong_on_softmax", "accuracy", "core",
                                expected_ops=1, needs="_softmax", signature="AccuracyError"),
}


# The two ops of different kinds each model's "two_ops" backend needs together, far apart in it.
TWO_OPS = {
    "resnet": f"{TESTING}:fail_on_max_pool_and_mean",
    "bert": f"{TESTING}:fail_on_gelu_and_layer_norm",
    "gpt2": f"{TESTING}:fail_on_gelu_and_layer_norm",
    "tv_resnet18": f"{TESTING}:fail_on_max_pool_and_mean",  # the stem's max pool, the head's average pool
    "tv_mobilenet_v3_small": f"{TESTING}:fail_on_clamp_and_mean",  # hardswish (clamp in core aten), pooling
    "hf_bert": f"{TESTING}:fail_on_gelu_and_layer_norm",
    "hf_gpt2": f"{TESTING}:fail_on_tanh_and_layer_norm",  # GPT-2's gelu is written out: tanh, pow, mul
}


# The ops each two-op backend needs together (tests/support/backends.py's raise_on_all): its message.
TWO_OPS_NEEDS = {
    "fail_on_max_pool_and_mean": ("max_pool2d_with_indices", "mean"),
    "fail_on_gelu_and_layer_norm": ("gelu", "native_layer_norm"),
    "fail_on_clamp_and_mean": ("clamp", "mean"),
    "fail_on_tanh_and_layer_norm": ("tanh", "native_layer_norm"),
}


def backend_for(model: str, failure: Failure) -> str:
    return failure.backend or TWO_OPS[model]


def signature_for(model: str, failure: Failure) -> str:
    """What the original fails with, as a capture records it (`failure.signature`)."""
    if failure.signature:
        return failure.signature
    ops = TWO_OPS_NEEDS[backend_for(model, failure).rsplit(":", 1)[1]]
    return f"RuntimeError: injected failure on {' and '.join(ops)} together"


def has_op(program: torch.export.ExportedProgram, op: str) -> bool:
    return any(node.op == "call_function" and getattr(getattr(node.target, "overloadpacket", None), "__name__", "")
               == op for node in program.graph_module.graph.nodes)


def save_zoo_case(model: str, failure: Failure, directory: Path) -> tuple[Path, int] | None:
    """Write MODEL-FAILURE.pt2; None when the model cannot show the failure (no relu for the relu bug,
    no softmax for the wrong softmax)."""
    program = export_model(model, failure.table)
    if failure.needs and not has_op(program, failure.needs):
        return None
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{model}-{failure.name}.pt2"
    torch.export.save(program, path)
    graph = torch.export.load(path).graph_module.graph
    return path, sum(1 for node in graph.nodes if node.op == "call_function")
