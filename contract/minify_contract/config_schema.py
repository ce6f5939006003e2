"""What a torch accepts in JobSpec.config: each key's JSON kinds and, where torch names them, its
choices; and the check of a spec's config against it.

A worker describes its own torch once at start (`describe_torch_config`, which imports torch) and
publishes it; the server checks every submitted spec against what its live workers published
before anything is queued (`config_problems`, a 422 naming the key and what it takes), and the
client asks the server for the same before uploading. A job that slipped through anyway (a worker
that published nothing) and failed on its own setting is told apart by `config_mistake`: it is the
user's mistake, never a compiler bug. Torch-free except `describe_torch_config`.

Checked on torch 2.13 (config modules' `_config` entries with `value_type` since 2.6; 2.11 to
2.15 keep that shape).
"""

from __future__ import annotations

import re
import types
import typing
from typing import Any

from pydantic import BaseModel, Field

from minify_contract.config_keys import CONFIG_MODULES, config_key

# JSON kinds of a config value.
KINDS = ("bool", "int", "float", "str", "null", "list", "dict")

# Settings whose values torch checks only while it compiles (an AssertionError mid-compile, which
# looks like a compiler bug): the choices its code recognises, read from torch 2.13's
# codegen/cpp.py and codegen/triton.py.
CHOICES_CHECKED_WHEN_COMPILING: dict[str, list[Any]] = {
    "cpp.inject_relu_bug_TESTING_ONLY": ["compile_error", "runtime_error", "accuracy", None],
    "triton.inject_relu_bug_TESTING_ONLY": ["compile_error", "runtime_error", "accuracy", None],
    "cpp.inject_log1p_bug_TESTING_ONLY": ["accuracy", None],
}

# How torch says, mid-compile, that a setting's value is not one it knows (codegen's asserts).
_UNRECOGNIZED = re.compile(r"unrecognized config (?P<key>[\w.]+) =")


class KeyRule(BaseModel):
    """What one key takes: any of `kinds` (None: anything), and only `choices` where given."""

    kinds: list[str] | None = None
    choices: list[Any] | None = None


class ConfigSchema(BaseModel):
    torch: str = Field(description="the torch version described")
    keys: dict[str, KeyRule] = Field(description="JobSpec.config key -> what it takes")


class ConfigSchemas(BaseModel):
    """`GET /v1/config`: what the torch of each live worker accepts (none published: nothing checked)."""

    schemas: list[ConfigSchema]


def config_problems(config: dict[str, Any], schema: ConfigSchema) -> list[str]:
    """Why `config` would not run on `schema`'s torch, one sentence per bad key (empty: it would)."""
    problems = []
    for key, value in config.items():
        rule = schema.keys.get(key)
        if rule is None:
            problems.append(f"config key {key!r} is not a setting of torch {schema.torch}"
                            f"{_did_you_mean(key, schema)}")
        elif rule.choices is not None and value not in rule.choices:
            allowed = ", ".join("null" if choice is None else repr(choice) for choice in rule.choices)
            problems.append(f"config {key}={value!r} is not one of {allowed} (torch {schema.torch})")
        elif rule.kinds is not None and _kind(value) not in rule.kinds and not _widens(value, rule.kinds):
            problems.append(f"config {key}={value!r} is a {_kind(value)}; torch {schema.torch} takes "
                            f"{' or '.join(rule.kinds)}")
    return problems


def config_mistake(signature: str | None, config: dict[str, Any]) -> str | None:
    """The job's own config key a failure's signature blames (torch refusing a value it was given
    mid-compile), or None: such a job found the user's mistake, not a compiler bug."""
    found = _UNRECOGNIZED.search(signature or "")
    if found is None:
        return None
    key = found["key"]
    for spelled in (key, f"torch._inductor.config.{key}"):
        if spelled in config:
            return spelled
    return None


def describe_torch_config() -> ConfigSchema:
    """The settings of this process's torch that a JobSpec.config key can set (imports torch)."""
    import importlib

    import torch

    keys: dict[str, KeyRule] = {}
    for module_name in CONFIG_MODULES:
        module: Any = importlib.import_module(module_name)
        for name, entry in getattr(module, "_config", {}).items():
            key = config_key(module_name, name)
            kinds, choices = _annotation_rule(getattr(entry, "value_type", None))
            default_kind = _kind(getattr(entry, "default", None))
            if kinds is not None and default_kind not in kinds:
                kinds = None  # torch's annotation and default disagree: trust neither
            keys[key] = KeyRule(kinds=kinds, choices=CHOICES_CHECKED_WHEN_COMPILING.get(key, choices))
    return ConfigSchema(torch=torch.__version__, keys=keys)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, dict):
        return "dict"
    return type(value).__name__


def _widens(value: Any, kinds: list[str]) -> bool:
    """An int where a float is taken (JSON writes 1.0 as 1)."""
    return "float" in kinds and _kind(value) == "int"


_SIMPLE_KINDS: dict[Any, str] = {bool: "bool", int: "int", float: "float", str: "str", type(None): "null",
                                 list: "list", tuple: "list", dict: "dict"}


def _annotation_rule(annotation: Any) -> tuple[list[str] | None, list[Any] | None]:
    """The JSON kinds (None: any) and the choices (None: any) of a config annotation."""
    if annotation is None:
        return None, None
    if annotation is type(None):
        return None, None  # a setting annotated only as None: torch has not said what it takes
    if annotation in _SIMPLE_KINDS:
        return [_SIMPLE_KINDS[annotation]], None
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        choices = list(typing.get_args(annotation))
        return sorted({_kind(choice) for choice in choices}), choices
    if origin in (typing.Union, types.UnionType):
        kinds: set[str] = set()
        choices_of_all: list[Any] | None = []
        for member in typing.get_args(annotation):
            member_kinds, member_choices = ((["null"], None) if member is type(None)
                                            else _annotation_rule(member))
            if member_kinds is None:
                return None, None
            kinds.update(member_kinds)
            if choices_of_all is not None and member_choices is not None:
                choices_of_all.extend(member_choices)
            elif member_kinds == ["null"] and choices_of_all is not None:
                choices_of_all.append(None)
            else:
                choices_of_all = None
        return sorted(kinds), choices_of_all
    if origin in _SIMPLE_KINDS:
        return [_SIMPLE_KINDS[origin]], None
    return None, None


def _did_you_mean(key: str, schema: ConfigSchema) -> str:
    import difflib

    close = difflib.get_close_matches(key, schema.keys, n=1, cutoff=0.8)
    return f" (did you mean {close[0]!r}?)" if close else ""
