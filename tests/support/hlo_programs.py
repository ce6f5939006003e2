"""StableHLO and HLO programs for the HLO minifier's tests (issue 32), lowered by jax here."""

from __future__ import annotations

from pathlib import Path

import numpy as np

FAST_MIN_MAX = {"xla.xla_cpu_enable_fast_min_max": True}


def nan_max_program() -> tuple[str, list[np.ndarray]]:
    """24 ops whose one output goes through a reduce-max of a row holding a NaN: XLA with
    `xla_cpu_enable_fast_min_max` drops the NaN (the row's max is a number, not NaN)."""
    import jax
    import jax.numpy as jnp

    def f(x, w):
        h = jnp.tanh(x) * 0.5 + 1.0
        m = jnp.max(h, axis=1)
        return jnp.exp(m - 1.0) * 2.0 + jnp.mean(w @ w.T)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    x[1, 2] = np.nan
    w = rng.standard_normal((8, 8)).astype(np.float32)
    return jax.jit(f).lower(x, w).as_text(), [x, w]


def control_flow_program() -> str:
    """A cond (stablehlo.case) and a while_loop carrying two values, then a reduce."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    def f(x, i):
        y = jnp.sin(x)
        z = lax.cond(i > 0, lambda: y * 2.0, lambda: y + x)
        w = lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 1.01), (0, z))
        return jnp.max(w[1], axis=1), w[0]

    return jax.jit(f).lower(jnp.ones((4, 8), jnp.float32), 1).as_text()


def hlo_text_program() -> str:
    """HLO text as XLA dumps it (`as_hlo_text`: what `--xla_dump_to` writes before optimizations)."""
    import jax
    import jax.numpy as jnp

    def f(x):
        return jnp.max(jnp.sin(x) * 2.0, axis=1)

    return jax.jit(f).lower(jnp.ones((4, 8), jnp.float32)).compiler_ir("hlo").as_hlo_text()


def write_program(folder: Path, text: str, arrays: list[np.ndarray] | None = None,
                  name: str = "program.mlir") -> tuple[Path, Path | None]:
    program = folder / name
    program.write_text(text)
    if arrays is None:
        return program, None
    inputs = folder / "inputs.npz"
    np.savez(inputs, *arrays)
    return program, inputs
