"""The fallback capture: the whole model, exported with the real inputs it was called with.

Used by `capture(model, args)` directly, and by `capture_failures` when its block failed but no
backend call did (a runtime error raised outside compiled code, say): no failing graph to take.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from minify_client.client import Client
from minify_contract.models import JobSpec

from .config import changed_config
from .destinations import Captured, resolve, save_and_submit


def capture(
    model: Any,
    args: Sequence[Any],
    kwargs: dict[str, Any] | None = None,
    *,
    spec: JobSpec | dict[str, Any] | None = None,
    name: str | None = None,
    submit_to: str | Client | None = None,
    token: str | None = None,
    save_to: str | os.PathLike[str] | None = None,
    config: dict[str, Any] | None = None,
) -> Captured:
    """Export `model` (an nn.Module, a torch.compile'd module or an ExportedProgram) with these
    inputs and submit it to `submit_to` and/or write it to `save_to`. `config`: the torch settings
    in effect when it failed (`config_values()`; default: now), of which those that differ from the
    defaults are recorded in the spec; the spec's own config keys win."""
    import torch

    kwargs = dict(kwargs or {})
    name = name or default_name(model)
    job_spec = spec_for(spec, [*args, *kwargs.values()])
    recorded = changed_config(config)
    job_spec = job_spec.model_copy(update={"config": {**recorded, **job_spec.config}})
    if isinstance(model, torch.export.ExportedProgram):
        program = model
    else:
        eager = getattr(model, "_orig_mod", model)  # torch.compile wraps modules in OptimizedModule
        program = torch.export.export(eager, tuple(args), kwargs)
    destination, submit_to = resolve(name, submit_to, save_to)
    return save_and_submit(program, args, kwargs, job_spec, name=name, destination=destination,
                           submit_to=submit_to, token=token)


def spec_for(spec: JobSpec | dict[str, Any] | None, inputs: Sequence[Any]) -> JobSpec:
    """The spec as given; a device left unsaid is the device of the inputs."""
    if isinstance(spec, JobSpec):
        return spec
    data = dict(spec or {})
    if "device" not in data and on_cuda(inputs):
        data["device"] = "cuda"
    return JobSpec.model_validate(data)


def on_cuda(values: Sequence[Any]) -> bool:
    import torch

    for value in values:
        if isinstance(value, torch.Tensor) and value.is_cuda:
            return True
        if isinstance(value, (list, tuple)) and on_cuda(value):
            return True
        if isinstance(value, dict) and on_cuda(list(value.values())):
            return True
    return False


def default_name(model: Any) -> str:
    import torch

    if isinstance(model, torch.export.ExportedProgram):
        return "program"
    return type(getattr(model, "_orig_mod", model)).__name__
