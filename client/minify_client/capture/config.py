"""The torch settings a capture records: every inductor, dynamo, functorch and symbolic-shapes
(`torch.fx.experimental._config`: duck sizing, size-oblivious sizes) setting that differs from its
default, as JobSpec.config keys.

Set by `config.patch`, a conftest, or a `TORCHINDUCTOR_*` variable, as torch's own after_aot repro
records them: a failure that needs them then reproduces on the server. Settings that cannot change
what is compiled (logging, caches, thread counts, custom pass callables) are left out. Inductor
keys are written as they are (`cpp.inject_relu_bug_TESTING_ONLY`), the others with their module
(`torch._dynamo.config.assume_static_by_default`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
import sys
from typing import Any

from minify_contract.config_keys import CONFIG_MODULES, config_key

logger = logging.getLogger(__name__)

_JSON_SCALARS = (bool, int, float, str, type(None))
# Settings torch itself writes while it compiles and leaves set, about the machine rather than the
# program: aoti_compile_and_package stores the CPU's ISA in aot_inductor.metadata (torch 2.13).
_WRITTEN_BY_TORCH = {"torch._inductor.config": ["aot_inductor.metadata"]}


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
    for module_name in CONFIG_MODULES:  # the config modules recorded: those a JobSpec.config key can set
        module: Any = importlib.import_module(module_name)
        # As save_config_portable leaves out: private keys, machine-specific or cache-only
        # prefixes; as codegen_config leaves out: _save_config_ignore; as the config hash does:
        # _compile_ignored keys (logging, ...).
        ignored_prefixes = ["_", *getattr(module, "_cache_config_ignore_prefix", [])]
        ignored_keys = [*getattr(module, "_save_config_ignore", []), *getattr(module, "_compile_ignored_keys", []),
                        *_WRITTEN_BY_TORCH.get(module_name, [])]
        try:
            values = module._get_dict(ignored_keys=ignored_keys, ignored_prefixes=ignored_prefixes,
                                      skip_default=skip_default)
        except (AttributeError, TypeError) as error:  # a torch whose config module differs
            logger.warning("minify: cannot read %s to record it: %s", module_name, error)
            continue
        for key, value in sorted(values.items()):
            if _json_value(value):
                recorded[config_key(module_name, key)] = json.loads(json.dumps(value))
            elif not module._is_default(key):
                logger.warning("minify: not recording %s.%s = %r: not a JSON value", module_name, key, value)
    return recorded


_DEFAULTS_SCRIPT = ("import json; from minify_client.capture.config import config_values; "
                    "print(json.dumps(config_values()))")


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


