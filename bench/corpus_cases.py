"""The corpus benchmark's cases (bench/corpus.py): architectures, the modes each runs in, the bug.

A case is an architecture and a mode. Every architecture is a real one at a tiny size, random
weights, nothing downloaded: `transformers` models built from their config class (1-2 layers,
hidden 16-32, sequences of 8, images of 32x32), their activation set to relu (each config names it
its own way: `hidden_act`, `activation_function`, `feed_forward_proj`, ...), and two vision nets
written here (bench/corpus_models.py). Modes:

- `inference`: `torch.compile(model)` under `torch.no_grad()`, eval mode;
- `dynamic`: the same with `torch.compile(model, dynamic=True)`;
- `training`: train mode, forward, a loss (the mean of the first output), `loss.backward()`;
- `accuracy`: `inference` with inductor's relu computing wrong values instead of failing to
  compile (only the architectures in `ACCURACY_ARCHITECTURES`).

The bug is inductor's own test hook, `cpp.inject_relu_bug_TESTING_ONLY`: `compile_error` (the C++
kernel of a relu does not compile) in the first three modes, `accuracy` (relu computes x + 1) in
the last. The buggy op is therefore aten `relu`: a minimal repro is a graph of that one op.

Imports no torch: the harness's parent reads this table; bench/corpus_models.py builds the models.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MODES = ("inference", "dynamic", "training", "accuracy")
DEFAULT_MODES = MODES
# The injected bug per mode: the value of `cpp.inject_relu_bug_TESTING_ONLY`.
BUG_KEY = "cpp.inject_relu_bug_TESTING_ONLY"
BUG_BY_MODE = {"inference": "compile_error", "dynamic": "compile_error", "training": "compile_error",
               "accuracy": "accuracy"}
# How the injected bug fails, as minify's signatures name it (minify_contract.signatures): the C++
# compiler's first error for the relu kernel (gcc quotes with U+2018/U+2019 in a UTF-8 locale, ' in
# the C locale: compare with `same_signature`); an accuracy failure by its type alone.
SIGNATURE_BY_BUG = {"compile_error": "CppCompileError: \u2018compile\u2019 was not declared in this scope",
                    "accuracy": "AccuracyError"}


def same_signature(first: str | None, second: str | None) -> bool:
    """Equal signatures, whichever quotes the compiler's locale gave them."""
    def plain(text: str) -> str:
        return text.replace("\u2018", "'").replace("\u2019", "'")

    return first is not None and second is not None and plain(first) == plain(second)
# The ops a minimal repro of the bug keeps: the relu, and what only reads a size or an output of it.
BUGGY_OPS = frozenset({"relu", "relu_"})
STRUCTURAL_OPS = frozenset({"getitem", "sym_size", "sym_numel", "sym_stride", "sym_storage_offset"})


@dataclass(frozen=True)
class Architecture:
    """One model: a transformers class and config (or a hand-built net), and its inputs' kind.

    `model` is `transformers.NAME` or `corpus_models:NAME`; `config` the keyword arguments of the
    transformers class's own config class (`NAME.config_class`), the relu setting apart in `relu` so
    the table shows it; `inputs` one of corpus_models.INPUTS.
    """

    name: str
    family: str
    model: str
    inputs: str
    config: dict[str, Any] = field(default_factory=dict)
    relu: dict[str, Any] = field(default_factory=dict)


# Tiny sizes shared by the text models (each config spells them its own way where it must).
_TEXT = {"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
         "intermediate_size": 32, "max_position_embeddings": 32, "use_cache": False}
_LLM = {**_TEXT, "num_key_value_heads": 2, "head_dim": 16, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
_SEQ2SEQ = {"vocab_size": 64, "d_model": 32, "encoder_layers": 1, "decoder_layers": 1,
            "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 32,
            "decoder_ffn_dim": 32, "max_position_embeddings": 32, "use_cache": False, "pad_token_id": 0,
            "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1, "forced_eos_token_id": None}
_VISION = {"image_size": 32, "patch_size": 8, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
           "intermediate_size": 32}
_SPEECH_ENCODER = {"vocab_size": 32, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                   "intermediate_size": 32, "conv_dim": (16, 16), "conv_stride": (5, 2), "conv_kernel": (10, 3),
                   "num_conv_pos_embeddings": 8, "num_conv_pos_embedding_groups": 4, "mask_time_prob": 0.0}


def _hf(name: str, family: str, model: str, inputs: str, config: dict[str, Any], relu: dict[str, Any]) -> Architecture:
    return Architecture(name, family, f"transformers.{model}", inputs, config, relu)


ARCHITECTURES: tuple[Architecture, ...] = (
    # decoder-only LLMs
    _hf("gpt2", "decoder", "GPT2LMHeadModel", "text",
        {"vocab_size": 64, "n_positions": 32, "n_embd": 32, "n_layer": 1, "n_head": 2, "use_cache": False,
         "bos_token_id": 1, "eos_token_id": 2}, {"activation_function": "relu"}),
    _hf("llama", "decoder", "LlamaForCausalLM", "text", _LLM, {"hidden_act": "relu"}),
    _hf("mistral", "decoder", "MistralForCausalLM", "text", {**_LLM, "sliding_window": 16}, {"hidden_act": "relu"}),
    _hf("qwen2", "decoder", "Qwen2ForCausalLM", "text", _LLM, {"hidden_act": "relu"}),
    _hf("qwen3", "decoder", "Qwen3ForCausalLM", "text", _LLM, {"hidden_act": "relu"}),
    _hf("phi", "decoder", "PhiForCausalLM", "text", {k: v for k, v in _LLM.items() if k != "head_dim"},
        {"hidden_act": "relu"}),
    _hf("gpt_neox", "decoder", "GPTNeoXForCausalLM", "text", {k: v for k, v in _LLM.items() if k != "head_dim"},
        {"hidden_act": "relu"}),
    _hf("opt", "decoder", "OPTForCausalLM", "text",
        {"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "ffn_dim": 32,
         "word_embed_proj_dim": 32, "max_position_embeddings": 32, "use_cache": False, "pad_token_id": 0,
         "bos_token_id": 1, "eos_token_id": 2}, {"activation_function": "relu"}),
    _hf("falcon", "decoder", "FalconForCausalLM", "text",
        {"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "use_cache": False,
         "bos_token_id": 1, "eos_token_id": 2}, {"activation": "relu"}),
    _hf("gemma", "decoder", "GemmaForCausalLM", "text", _LLM, {"hidden_act": "relu", "hidden_activation": "relu"}),
    _hf("starcoder2", "decoder", "Starcoder2ForCausalLM", "text", {k: v for k, v in _LLM.items() if k != "head_dim"},
        {"hidden_act": "relu"}),
    _hf("gptj", "decoder", "GPTJForCausalLM", "text",
        {"vocab_size": 64, "n_positions": 32, "n_embd": 32, "n_layer": 1, "n_head": 2, "rotary_dim": 8,
         "use_cache": False, "bos_token_id": 1, "eos_token_id": 2}, {"activation_function": "relu"}),
    # encoder-decoder
    _hf("t5", "encoder-decoder", "T5ForConditionalGeneration", "seq2seq",
        {"vocab_size": 64, "d_model": 32, "d_kv": 16, "d_ff": 32, "num_layers": 1, "num_decoder_layers": 1,
         "num_heads": 2, "use_cache": False, "pad_token_id": 0, "eos_token_id": 2, "decoder_start_token_id": 0},
        {"feed_forward_proj": "relu"}),
    _hf("bart", "encoder-decoder", "BartForConditionalGeneration", "seq2seq", _SEQ2SEQ,
        {"activation_function": "relu"}),
    _hf("marian", "encoder-decoder", "MarianMTModel", "seq2seq", _SEQ2SEQ, {"activation_function": "relu"}),
    _hf("pegasus", "encoder-decoder", "PegasusForConditionalGeneration", "seq2seq", _SEQ2SEQ,
        {"activation_function": "relu"}),
    _hf("m2m100", "encoder-decoder", "M2M100ForConditionalGeneration", "seq2seq", _SEQ2SEQ,
        {"activation_function": "relu"}),
    # encoders
    _hf("bert", "encoder", "BertModel", "text", _TEXT, {"hidden_act": "relu"}),
    _hf("roberta", "encoder", "RobertaModel", "text", {**_TEXT, "pad_token_id": 1}, {"hidden_act": "relu"}),
    _hf("distilbert", "encoder", "DistilBertModel", "text",
        {"vocab_size": 64, "dim": 32, "n_layers": 1, "n_heads": 2, "hidden_dim": 32, "max_position_embeddings": 32},
        {"activation": "relu"}),
    _hf("albert", "encoder", "AlbertModel", "text", {**_TEXT, "embedding_size": 16}, {"hidden_act": "relu"}),
    _hf("electra", "encoder", "ElectraModel", "text", {**_TEXT, "embedding_size": 16}, {"hidden_act": "relu"}),
    _hf("deberta_v2", "encoder", "DebertaV2Model", "text", _TEXT, {"hidden_act": "relu"}),
    _hf("mobilebert", "encoder", "MobileBertModel", "text",
        {**_TEXT, "embedding_size": 16, "intra_bottleneck_size": 16, "true_hidden_size": 16,
         "num_feedforward_networks": 1}, {"hidden_act": "relu"}),
    # vision transformers and a modern conv net
    _hf("vit", "vision", "ViTForImageClassification", "image", _VISION, {"hidden_act": "relu"}),
    _hf("deit", "vision", "DeiTForImageClassification", "image", _VISION, {"hidden_act": "relu"}),
    _hf("beit", "vision", "BeitForImageClassification", "image", _VISION, {"hidden_act": "relu"}),
    _hf("swin", "vision", "SwinForImageClassification", "image",
        {"image_size": 32, "patch_size": 4, "embed_dim": 16, "depths": [1, 1], "num_heads": [2, 2], "window_size": 2,
         "mlp_ratio": 2.0}, {"hidden_act": "relu"}),
    _hf("convnext", "vision", "ConvNextForImageClassification", "image",
        {"hidden_sizes": [16, 32], "depths": [1, 1], "num_stages": 2}, {"hidden_act": "relu"}),
    # speech
    _hf("wav2vec2", "speech", "Wav2Vec2Model", "audio", _SPEECH_ENCODER, {"hidden_act": "relu"}),
    _hf("hubert", "speech", "HubertModel", "audio", _SPEECH_ENCODER, {"hidden_act": "relu"}),
    _hf("whisper", "speech", "WhisperForConditionalGeneration", "mel",
        {"vocab_size": 64, "num_mel_bins": 16, "d_model": 32, "encoder_layers": 1, "decoder_layers": 1,
         "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 32, "decoder_ffn_dim": 32,
         "max_source_positions": 8, "max_target_positions": 16, "use_cache": False, "pad_token_id": 0,
         "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1, "begin_suppress_tokens": None,
         "suppress_tokens": None}, {"activation_function": "relu"}),
    # mixtures of experts
    _hf("mixtral", "moe", "MixtralForCausalLM", "text", {**_LLM, "num_local_experts": 4, "num_experts_per_tok": 2},
        {"hidden_act": "relu"}),
    _hf("qwen2_moe", "moe", "Qwen2MoeForCausalLM", "text",
        {**_LLM, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
         "shared_expert_intermediate_size": 16}, {"hidden_act": "relu"}),
    # hand-built vision nets (bench/corpus_models.py)
    Architecture("resnet_bn", "vision (hand-built)", "corpus_models:ResNetBN", "image"),
    Architecture("mobilenet_dw", "vision (hand-built)", "corpus_models:DepthwiseNet", "image"),
)
BY_NAME = {architecture.name: architecture for architecture in ARCHITECTURES}

# The wrong-values subset: one per family where the relu's output reaches the first output directly
# enough for x + 1 to show (a decoder, an encoder-decoder, an encoder, a conv net).
ACCURACY_ARCHITECTURES = ("opt", "t5", "bert", "resnet_bn")


@dataclass(frozen=True)
class Case:
    architecture: str
    mode: str

    @property
    def name(self) -> str:
        return f"{self.architecture}-{self.mode}"

    @property
    def bug(self) -> str:
        return BUG_BY_MODE[self.mode]


def all_cases(modes: tuple[str, ...] = DEFAULT_MODES) -> list[Case]:
    """Every architecture in every mode of `modes` (`accuracy`: the subset), mode by mode."""
    cases = []
    for mode in modes:
        names = ACCURACY_ARCHITECTURES if mode == "accuracy" else [a.name for a in ARCHITECTURES]
        cases += [Case(name, mode) for name in names]
    return cases
