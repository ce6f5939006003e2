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
from pathlib import Path
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
    variables, once per environment and torch installation (cached on disk:
    `defaults_cache_dir()`).
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


# Variables that differ from one run, test or shell to the next and that no config module reads:
# left out of the cache's key unless the run that filled the entry saw a config module read one.
_VOLATILE_PREFIXES = ("PYTEST_", "MINIFY_")
# _TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR: an address in this process, which inductor sets once it
# loads a compiled kernel (before a capture reads the defaults, in a program that compiled), so that
# every such process had an environment of its own and read the defaults again (~2 CPU-s each).
_VOLATILE = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "TMPDIR", "TEMP", "TMP", "COLUMNS", "LINES",
                       "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"})
_CACHE_ENTRIES = 8  # per torch installation: one per environment seen, the newest kept
# Runs in the fresh Python: records the variables read while a config module is on the stack (a
# default computed from one at import), and every variable read while the defaults are collected
# (a default read when asked for), then prints the defaults and those reads.
_DEFAULTS_SCRIPT = """
import importlib, json, os, sys
config_files = set(json.loads(sys.argv[1]))
read, collecting = {}, False
plain_getitem = type(os.environ).__getitem__

def getitem(environ, name):
    frame = sys._getframe(1)
    while not collecting and frame is not None and frame.f_code.co_filename not in config_files:
        frame = frame.f_back
    try:
        value = plain_getitem(environ, name)
    except KeyError:
        value = None
        raise
    finally:
        if collecting or frame is not None:
            read[name] = value
    return value

type(os.environ).__getitem__ = getitem
from minify_client.capture.config import CONFIG_MODULES, config_values
for module in CONFIG_MODULES:
    importlib.import_module(module)
collecting = True
print(json.dumps({"defaults": config_values(), "read": read}))
"""


def defaults_cache_dir() -> Path:
    """Where the settings' defaults are cached: `capture-defaults/` in minify's cache dir
    (`$MINIFY_CACHE_DIR`, else `$XDG_CACHE_HOME/minify`, else `~/.cache/minify`). Removing it is
    always safe: the next capture reads the defaults again."""
    configured = os.environ.get("MINIFY_CACHE_DIR", "")
    if configured and configured != "job":  # `job` is the worker's per-job compile cache
        base = Path(configured)
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "minify"
    return base / "capture-defaults"


@functools.cache  # the defaults cannot change within a process
def _defaults_without_environment() -> dict[str, Any] | None:
    """torch's config defaults in a fresh Python without TORCH* variables, cached on disk.

    A cache file holds the entries of one Python, torch installation and version of this module
    (its key, hashed into the file name). An entry is served only to an environment that equals
    the one it was read in, TORCH* variables aside (never seen by the fresh Python) and volatile
    ones aside (`_VOLATILE`: unless a config module read one while the entry was read)."""
    environment = {name: value for name, value in os.environ.items() if not name.startswith("TORCH")}
    path = _cache_path()
    cached = _cached_defaults(path, environment) if path is not None else None
    if cached is not None:
        return cached
    try:
        done = subprocess.run([sys.executable, "-c", _DEFAULTS_SCRIPT, json.dumps(_config_files())],
                              env=environment, capture_output=True, text=True, timeout=300, check=True)
        read = json.loads(done.stdout.strip().splitlines()[-1])
        defaults, volatile_read = read["defaults"], read["read"]
    except (OSError, subprocess.SubprocessError, ValueError, IndexError, KeyError, TypeError) as error:
        logger.warning("minify: cannot read torch's config defaults (%s); recording only settings changed "
                       "in this process", error)
        return None
    if not isinstance(defaults, dict):
        return None
    if path is not None:
        keyed = {name for name in volatile_read if _volatile(name)}
        _store(path, {"environment": _key_environment(environment, keyed), "keyed_volatile": sorted(keyed),
                      "defaults": defaults})
    return defaults


def _volatile(name: str) -> bool:
    return name in _VOLATILE or name.startswith(_VOLATILE_PREFIXES)


def _key_environment(environment: dict[str, str], keyed_volatile: set[str]) -> str:
    """The digest an entry is keyed by: of every variable but the volatile ones not read. A digest,
    not the variables: the environment holds secrets (tokens, keys) a cache file must not keep."""
    import hashlib

    kept: dict[str, str | None] = {name: value for name, value in environment.items() if not _volatile(name)}
    kept.update({name: environment.get(name) for name in keyed_volatile})
    return hashlib.sha256(json.dumps(sorted(kept.items())).encode()).hexdigest()


def _config_files() -> list[str]:
    """The source files of the config modules recorded, found without importing them."""
    import importlib.util

    torch_spec = importlib.util.find_spec("torch")
    if torch_spec is None or torch_spec.origin is None:
        return []
    root = Path(torch_spec.origin).parent.parent
    return [str(root.joinpath(*name.split(".")).with_suffix(".py")) for name in CONFIG_MODULES]


def _cache_path() -> Path | None:
    """The cache file of this Python, torch installation and version of this module; None where
    torch's version cannot be read without a fresh Python (then nothing is cached)."""
    import hashlib
    import platform

    torch = sys.modules.get("torch")
    if torch is None or not getattr(torch, "__file__", None):
        return None
    from minify_contract import config_keys

    sources = b"".join(Path(module).read_bytes() for module in (__file__, config_keys.__file__))
    key = json.dumps([os.path.realpath(sys.executable), sys.version, os.path.realpath(torch.__file__),
                      str(torch.__version__), getattr(getattr(torch, "version", None), "git_version", None),
                      hashlib.sha256(sources).hexdigest(), platform.node()])
    return defaults_cache_dir() / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def _cached_defaults(path: Path, environment: dict[str, str]) -> dict[str, Any] | None:
    for entry in _entries(path):
        keyed = set(entry["keyed_volatile"])
        if entry["environment"] == _key_environment(environment, keyed):
            return entry["defaults"]
    return None


def _entries(path: Path) -> list[dict[str, Any]]:
    """The cache file's entries; none from a file that is missing or not what this module writes."""
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(entries, list):
        return []
    return [entry for entry in entries if isinstance(entry, dict) and isinstance(entry.get("environment"), str)
            and isinstance(entry.get("keyed_volatile"), list) and isinstance(entry.get("defaults"), dict)]


def _store(path: Path, entry: dict[str, Any]) -> None:
    """Add `entry` as the newest, written whole (a reader never sees half a file); a cache that
    cannot be written is only a slower next capture."""
    import tempfile

    entries = [kept for kept in _entries(path) if kept["environment"] != entry["environment"]]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as out:
            json.dump([*entries[-(_CACHE_ENTRIES - 1):], entry], out)
        os.replace(out.name, path)
    except OSError as error:
        logger.info("minify: cannot cache torch's config defaults in %s: %s", path.parent, error)


def _json_value(value: Any) -> bool:
    if isinstance(value, _JSON_SCALARS):
        return True
    if isinstance(value, (list, tuple)):
        return all(_json_value(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and _json_value(item) for key, item in value.items())
    return False


