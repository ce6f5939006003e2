"""What the culprit phase tries: the settings a user can flip that may avoid the bug, for the job's
backend, and whether that backend has compiler stages for torch's bisector at all."""

from __future__ import annotations

import importlib
from typing import Any

from minify_contract.config_keys import config_setting
from minify_contract.models import JobSpec
from minify_worker.programs.fx import bisector

BACKEND = "backend"  # a workaround that changes the backend, not a config key

# Settings tried beside the bisector's config changes (bisector.config_changes), and why:
# - pattern_matcher off: inductor's pattern rewrites (fusions, replacements) are where wrong
#   rewrites live, and turning them off keeps the rest of inductor;
# - freezing on: parameters folded as constants, another path through inductor's passes;
# - cpp_wrapper on: C++ instead of Python wrapper code (aot_inductor always uses it);
# - the aot_eager backend (inductor jobs only): the same graph through aot_autograd without
#   inductor, slower but a way around any inductor bug.
# Not max_autotune: it benchmarks kernel choices while compiling, multiplying each probe's cost,
# and it adds code paths more often than it avoids one.
EXTRA_SETTINGS: tuple[tuple[str, Any], ...] = (("pattern_matcher", False), ("freezing", True),
                                              ("cpp_wrapper", True))


def settings(spec: JobSpec) -> list[tuple[str, Any]]:
    """The settings worth trying for the spec's backend, each different from what the job uses:
    inductor's config for backends that use inductor (custom ones may), functorch's cse for those
    that trace with aot_autograd, the aot_eager backend for inductor jobs."""
    if spec.backend == "eager":
        return []
    changes = [(key, value) for _, key, value in bisector.config_changes()]
    if spec.backend != "aot_eager":
        changes += [(key, value) for key, value in EXTRA_SETTINGS
                    if not (key == "cpp_wrapper" and spec.backend == "aot_inductor")]
    else:
        changes = [(key, value) for key, value in changes if key.startswith("torch._functorch.")]
    wanted = [(key, value) for key, value in changes if current_value(key, spec) != value]
    if spec.backend == "inductor":
        wanted.append((BACKEND, "aot_eager"))
    return wanted


def current_value(key: str, spec: JobSpec) -> Any:
    if key in spec.config:
        return spec.config[key]
    module, setting = config_setting(key)
    owner: Any = importlib.import_module(module)
    for part in setting.split("."):
        owner = getattr(owner, part, None)
    return owner


def no_stages(spec: JobSpec) -> str | None:
    """Why the spec's backend has nothing for the compiler bisector to bisect, if it has not."""
    if spec.backend in ("inductor", "aot_inductor"):
        return bisector.available()
    if spec.backend.count(":"):
        return (f"the custom backend {spec.backend} is opaque to torch's compiler bisector: it has no stages or "
                "subsystems to bisect (only inductor and aot_inductor have)")
    return (f"the {spec.backend} backend has no stages for torch's compiler bisector to bisect (only inductor "
            "and aot_inductor have)")
