"""JobSpec.config keys, and the torch config module each one sets: one spelling for the capture
that records them, the worker that applies them, the culprit phase that reads them and repro.py
that writes them.

A setting of `torch._inductor.config` is keyed as it is (`cpp.inject_relu_bug_TESTING_ONLY`), a
setting of another config module with that module's name before it
(`torch._dynamo.config.assume_static_by_default`); `torch._inductor.config.X` is inductor's `X`
too. Pure and torch-free: the client installs without torch.
"""

from __future__ import annotations

INDUCTOR_CONFIG = "torch._inductor.config"

# The config modules a key can set, and the prefix their keys carry (inductor's none).
CONFIG_MODULES = {
    INDUCTOR_CONFIG: "",
    "torch._dynamo.config": "torch._dynamo.config.",
    "torch._functorch.config": "torch._functorch.config.",
    # The ShapeEnv's settings (use_duck_shape, backed_size_oblivious, ...): how symbols are made.
    "torch.fx.experimental._config": "torch.fx.experimental._config.",
}


def config_key(module: str, name: str) -> str:
    """The JobSpec.config key of setting `name` (dotted) of `module`, one of CONFIG_MODULES."""
    return CONFIG_MODULES[module] + name


def config_setting(key: str) -> tuple[str, str]:
    """The config module a JobSpec.config key sets, and the dotted name of the setting in it:
    `cpp.x` -> (torch._inductor.config, cpp.x), `torch._dynamo.config.y` -> (torch._dynamo.config, y)."""
    for module in CONFIG_MODULES:
        if key.startswith(module + "."):
            return module, key.removeprefix(module + ".")
    return INDUCTOR_CONFIG, key
