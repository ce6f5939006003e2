"""Turn a compile failure in a test suite into a minify job, or into files to submit later.

    from minify_client.capture import capture_failures

    with capture_failures(model, (x,), spec={"config": {...}}, submit_to="http://minify:8000"):
        torch.compile(model)(x)            # or torch._inductor.aoti_compile_and_package(ep)

When the block raises, the model is exported with the block's real inputs
(`torch.export.export(model, args, kwargs)`), submitted or written as `<dir>/<name>.pt2`,
`<dir>/spec.json` and `<dir>/inputs.pt`, and the original error is re-raised with a note that
says where the capture went. Without `submit_to` and `save_to`, `$MINIFY_CAPTURE_DIR/<name>/` is
used when set, else a submission to `$MINIFY_SERVER` when set, else `./minify-captures/<name>/`.

The spec's `config` records every inductor, dynamo and functorch setting that differs from its
default (set by `config.patch`, a conftest, or a `TORCHINDUCTOR_*` variable), as torch's own
after_aot repro does: a failure that needs them then reproduces on the server. Settings that
cannot change what is compiled (logging, caches, thread counts, custom pass callables) are left
out. Inductor keys are written as they are (`cpp.inject_relu_bug_TESTING_ONLY`), the others with
their module (`torch._dynamo.config.assume_static_by_default`). The settings are read when the
failing torch.compile started compiling (unless `torch._dynamo.reset()`, which drops that hook,
ran in the block since), else when the block ends; keys the spec names win.

torch is imported here only, and only when a capture block is entered or something is captured:
the rest of the client installs and imports without it.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from contextlib import ContextDecorator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from minify_client.client import Client
from minify_client.models import JobCreated, JobSpec

logger = logging.getLogger(__name__)

DEFAULT_CAPTURE_DIR = Path("minify-captures")

# The config modules recorded, and the prefix their keys carry in JobSpec.config (inductor's none:
# the spec's keys are inductor's).
CONFIG_MODULES = {
    "torch._inductor.config": "",
    "torch._dynamo.config": "torch._dynamo.config.",
    "torch._functorch.config": "torch._functorch.config.",
}
_JSON_SCALARS = (bool, int, float, str, type(None))


@dataclass(frozen=True)
class Captured:
    """Where a captured program went: files kept in `directory` (None when only submitted), and
    the job when it was submitted."""

    name: str
    spec: JobSpec
    directory: Path | None = None
    job: JobCreated | None = None
    dashboard: str | None = None

    @property
    def program(self) -> Path | None:
        return self.directory / f"{self.name}.pt2" if self.directory is not None else None

    def describe(self) -> str:
        """One line for a log or an exception note."""
        parts = []
        if self.job is not None:
            parts.append(f"submitted as minify job {self.job.id} ({self.dashboard})")
        if self.directory is not None:
            parts.append(
                f"saved to {self.directory}; submit with: minify-client submit {self.program} "
                f"--spec {self.directory / 'spec.json'} --inputs {self.directory / 'inputs.pt'} --wait"
            )
        return "minify: failing program " + "; ".join(parts)


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
    name = name or _default_name(model)
    job_spec = _spec_for(spec, args, kwargs)
    recorded = changed_config(config)
    job_spec = job_spec.model_copy(update={"config": {**recorded, **job_spec.config}})
    if isinstance(model, torch.export.ExportedProgram):
        program = model
    else:
        eager = getattr(model, "_orig_mod", model)  # torch.compile wraps modules in OptimizedModule
        program = torch.export.export(eager, tuple(args), kwargs)

    destination, submit_to = _destinations(name, submit_to, save_to)
    directory = destination or Path(tempfile.mkdtemp(prefix="minify-capture-"))
    try:
        directory.mkdir(parents=True, exist_ok=True)
        program_path = directory / f"{name}.pt2"
        torch.export.save(program, program_path)
        (directory / "spec.json").write_text(job_spec.model_dump_json(indent=2) + "\n")
        torch.save((tuple(args), kwargs), directory / "inputs.pt")
        job = dashboard = None
        if submit_to is not None:
            client = submit_to if isinstance(submit_to, Client) else Client(submit_to, token)
            try:
                job = client.submit(program_path, job_spec, inputs=directory / "inputs.pt")
                dashboard = client.dashboard_url(job)
            finally:
                if client is not submit_to:
                    client.close()
    finally:
        if destination is None:
            shutil.rmtree(directory, ignore_errors=True)
    captured = Captured(name=name, spec=job_spec, directory=destination, job=job, dashboard=dashboard)
    logger.warning("%s", captured.describe())
    return captured


class capture_failures(ContextDecorator):  # lower case: it reads as a function at the call site
    """Capture the program when the block (or decorated function) raises one of `exceptions`,
    then re-raise the original error. A capture that itself fails is logged and noted on the
    original error; it never replaces it."""

    def __init__(
        self,
        model: Any,
        args: Sequence[Any],
        kwargs: dict[str, Any] | None = None,
        *,
        spec: JobSpec | dict[str, Any] | None = None,
        name: str | None = None,
        submit_to: str | Client | None = None,
        token: str | None = None,
        save_to: str | os.PathLike[str] | None = None,
        exceptions: tuple[type[BaseException], ...] = (Exception,),
    ) -> None:
        self._model = model
        self._args = args
        self._kwargs = kwargs
        self._options: dict[str, Any] = {
            "spec": spec, "name": name, "submit_to": submit_to, "token": token, "save_to": save_to,
        }
        self._exceptions = exceptions
        self.captured: Captured | None = None
        self.capture_error: Exception | None = None
        self._config_at_compile: dict[str, Any] | None = None  # config_values() at the last compile

    def __enter__(self) -> capture_failures:
        from torch._dynamo.callback import callback_handler

        # A config.patch inside the block is undone by the time the block ends: read the config
        # when a compile starts too.
        callback_handler.register_start_callback(self._on_compile_start)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> bool:
        from torch._dynamo.callback import callback_handler

        if self._on_compile_start in callback_handler.start_callbacks:  # torch._dynamo.reset() clears them
            callback_handler.remove_start_callback(self._on_compile_start)
        config_at_compile, self._config_at_compile = self._config_at_compile, None
        if error is None or not isinstance(error, self._exceptions):
            return False
        try:
            self.captured = capture(self._model, self._args, self._kwargs, config=config_at_compile,
                                    **self._options)
        except Exception as capture_error:
            self.capture_error = capture_error
            logger.warning("minify: could not capture the failing program: %s", capture_error)
            _add_note(error, f"minify: could not capture the failing program: {capture_error}")
        else:
            _add_note(error, self.captured.describe())
        return False


    def _on_compile_start(self, _: Any) -> None:
        self._config_at_compile = config_values()


def changed_config(values: dict[str, Any] | None = None) -> dict[str, Any]:
    """The settings in `values` (default: `config_values()` now) that differ from torch's defaults,
    as JobSpec.config keys (see the module docstring).

    Many of torch's settings take their default from a variable read at import
    (`TORCHINDUCTOR_FREEZING=1`): the defaults are read in a fresh Python without TORCH*
    variables, once per capture.
    """
    current = config_values() if values is None else values
    defaults = _defaults_without_environment()
    if defaults is None:
        return config_values(skip_default=True)
    return {key: value for key, value in current.items() if key not in defaults or defaults[key] != value}


def config_values(*, skip_default: bool = False) -> dict[str, Any]:
    """Every recordable inductor, dynamo and functorch setting in effect (only those changed in
    this process with `skip_default`), with JSON values (tuples as lists), as JobSpec.config keys."""
    import importlib

    recorded: dict[str, Any] = {}
    for module_name, prefix in CONFIG_MODULES.items():
        module: Any = importlib.import_module(module_name)
        # As save_config_portable leaves out: private keys, machine-specific or cache-only
        # prefixes; as codegen_config leaves out: _save_config_ignore; as the config hash does:
        # _compile_ignored keys (logging, ...).
        ignored_prefixes = ["_", *getattr(module, "_cache_config_ignore_prefix", [])]
        ignored_keys = [*getattr(module, "_save_config_ignore", []), *getattr(module, "_compile_ignored_keys", [])]
        try:
            values = module._get_dict(ignored_keys=ignored_keys, ignored_prefixes=ignored_prefixes,
                                      skip_default=skip_default)
        except (AttributeError, TypeError) as error:  # a torch whose config module differs
            logger.warning("minify: cannot read %s to record it: %s", module_name, error)
            continue
        for key, value in sorted(values.items()):
            if _json_value(value):
                recorded[prefix + key] = json.loads(json.dumps(value))
            elif not module._is_default(key):
                logger.warning("minify: not recording %s.%s = %r: not a JSON value", module_name, key, value)
    return recorded


_DEFAULTS_SCRIPT = "import json; from minify_client.capture import config_values; print(json.dumps(config_values()))"


@functools.cache  # the defaults cannot change within a process
def _defaults_without_environment() -> dict[str, Any] | None:
    environment = {name: value for name, value in os.environ.items() if not name.startswith("TORCH")}
    try:
        done = subprocess.run([sys.executable, "-c", _DEFAULTS_SCRIPT], env=environment, capture_output=True,
                              text=True, timeout=300, check=True)
        defaults = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as error:
        logger.warning("minify: cannot read torch's config defaults (%s); recording only settings changed "
                       "in this process", error)
        return None
    return defaults if isinstance(defaults, dict) else None


def _json_value(value: Any) -> bool:
    if isinstance(value, _JSON_SCALARS):
        return True
    if isinstance(value, (list, tuple)):
        return all(_json_value(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and _json_value(item) for key, item in value.items())
    return False


def _destinations(
    name: str, submit_to: str | Client | None, save_to: str | os.PathLike[str] | None
) -> tuple[Path | None, str | Client | None]:
    if submit_to is not None or save_to is not None:
        return (Path(save_to) if save_to is not None else None), submit_to
    if os.environ.get("MINIFY_CAPTURE_DIR"):
        return Path(os.environ["MINIFY_CAPTURE_DIR"]) / name, None
    if os.environ.get("MINIFY_SERVER"):
        return None, os.environ["MINIFY_SERVER"]
    return DEFAULT_CAPTURE_DIR / name, None


def _spec_for(spec: JobSpec | dict[str, Any] | None, args: Sequence[Any], kwargs: dict[str, Any]) -> JobSpec:
    """The spec as given; a device left unsaid is the device of the inputs."""
    if isinstance(spec, JobSpec):
        return spec
    data = dict(spec or {})
    if "device" not in data and _on_cuda([*args, *kwargs.values()]):
        data["device"] = "cuda"
    return JobSpec.model_validate(data)


def _on_cuda(values: Sequence[Any]) -> bool:
    import torch

    for value in values:
        if isinstance(value, torch.Tensor) and value.is_cuda:
            return True
        if isinstance(value, (list, tuple)) and _on_cuda(value):
            return True
        if isinstance(value, dict) and _on_cuda(list(value.values())):
            return True
    return False


def _default_name(model: Any) -> str:
    import torch

    if isinstance(model, torch.export.ExportedProgram):
        return "program"
    return type(getattr(model, "_orig_mod", model)).__name__


def _add_note(error: BaseException, note: str) -> None:
    if hasattr(error, "add_note"):  # Python 3.11+
        error.add_note(note)
