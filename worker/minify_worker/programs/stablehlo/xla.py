"""XLA through jax: compile a module's text with per-compile XLA options and run it, or evaluate
it with StableHLO's reference interpreter. Sandbox children only. Checked on jax/jaxlib 0.10.2:
`jax.extend.backend.get_backend(platform).compile_and_load(text, devices, options)`, options from
`jax._src.compiler.get_compile_options(..., env_options_overrides=...)` (any XLA flag,
`xla_cpu_enable_fast_min_max`, as `XLA_FLAGS` would set it, but for this compile only).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

# Spec config keys for XLA: `xla.<flag>` (`--config xla.xla_cpu_enable_fast_min_max=true`).
CONFIG_PREFIX = "xla."
# What XLA says when an option, not the program, is wrong: the job's problem, not a candidate's.
OPTION_ERRORS = ("No such compile option", "While setting option")


class OptionError(Exception):
    """The spec's XLA options cannot be used (an unknown flag, a value of the wrong type)."""


def xla_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """The XLA flags of a spec's config: its `xla.`-prefixed keys, without the prefix."""
    return {key.removeprefix(CONFIG_PREFIX): value for key, value in config.items() if key.startswith(CONFIG_PREFIX)}


def platform(device: str) -> str:
    """jax's platform for a spec's device: `cpu`, or `cuda` for `cuda` / `cuda:N`."""
    return "cuda" if device.startswith("cuda") else "cpu"


Program = Callable[[Sequence[np.ndarray]], list[np.ndarray]]


def compile_module(text: str, options: Mapping[str, Any], device: str = "cpu") -> Program:
    """Compile `text` with XLA under `options`; the callable runs it on numpy arrays. Raises what
    XLA raises (`JaxRuntimeError`), or `OptionError` for options XLA refuses."""
    import jax.extend
    from jax._src import compiler
    from jax._src.lib import xla_client

    # The module's types are what they are: without x64, jax would turn an f64 or i64 array into
    # a 32-bit buffer on its way to the device (and the run would refuse it).
    jax.config.update("jax_enable_x64", True)
    backend = jax.extend.backend.get_backend(platform(device))
    index = int(device.partition(":")[2] or 0)
    target = backend.devices()[index]
    compile_options = compiler.get_compile_options(1, 1, env_options_overrides=dict(options))
    try:
        executable = backend.compile_and_load(text, xla_client.DeviceList((target,)), compile_options)
    except Exception as error:
        if any(marker in str(error) for marker in OPTION_ERRORS):
            raise OptionError(f"XLA refuses the job's options: {str(error).strip()}") from error
        raise

    def run(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        buffers = [jax.device_put(array, target) for array in arrays]
        outputs = executable.execute(buffers)
        return [np.asarray(output) for output in outputs]

    return run


def interpret(text: str, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """`text` evaluated by StableHLO's reference interpreter (slow; exact to the spec)."""
    from jax._src.lib.mlir import ir
    from jaxlib.mlir._mlir_libs import _stablehlo

    from .parse import context

    ctx = context()
    with ctx:
        parsed = ir.Module.parse(text)
        attributes = [ir.DenseElementsAttr.get(np.asarray(array).copy(order="C")) for array in arrays]
        return [np.array(result) for result in _stablehlo.eval_module(parsed, attributes)]


NARROW_FLOATS = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
HEX_CONSTANT = re.compile(r'dense<(?P<quote>"?)0x(?P<hex>[0-9A-Fa-f]+)"?>(?P<type>\s*:\s*tensor<(?:\d+x)*)'
                           r'(?P<element>f32|f16|bf16)>')
NARROW_TYPE = re.compile(r"(tensor<(?:[0-9?]+x)*)(?:f32|f16|bf16)(?=[>,])")


def to_f64(text: str) -> str:
    """The module with every f32, f16 and bf16 tensor made f64: the fp64 reference's program. A
    constant MLIR wrote in hex (NaN, infinities, large arrays) is re-encoded at the new width."""
    import ml_dtypes

    def widen_constant(match: re.Match[str]) -> str:
        name = NARROW_FLOATS[match["element"]]
        dtype = np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)
        if match["quote"]:  # an array: its little-endian bytes
            narrow = np.frombuffer(bytes.fromhex(match["hex"]), dtype=dtype.newbyteorder("<"))
            wide = f'"0x{narrow.astype("<f8").tobytes().hex().upper()}"'
        else:  # a splat: the element's bits, as a number
            narrow = np.array([int(match["hex"], 16)], dtype=f"u{dtype.itemsize}").view(dtype)
            wide = f"0x{int(narrow.astype(np.float64).view(np.uint64)[0]):016X}"
        return f"dense<{wide}>{match['type']}f64>"

    return NARROW_TYPE.sub(r"\1f64", HEX_CONSTANT.sub(widen_constant, text))


def widened(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """`arrays` with f32, f16 and bf16 ones as f64 (the inputs of `to_f64`'s program)."""
    names = set(NARROW_FLOATS.values())
    return [array.astype(np.float64) if array.dtype.name in names else array for array in arrays]
