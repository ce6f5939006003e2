"""StableHLO and HLO programs for the HLO minifier's tests (issue 32), checked in under hlo/.

Made once with jax 0.10.2 (`jax.jit(f).lower(*args).as_text()`, HLO by `.compiler_ir("hlo")
.as_hlo_text()`), and read from files here: lowering with jax in the test process would start
XLA's CPU client and its threads, and a sandbox forked from that process could deadlock. So the
test process only parses MLIR (no thread); whatever compiles runs in a sandbox child or a fresh
process.

- nan_max.mlir, 24 ops: `f(x, w) = exp(max(tanh(x) * 0.5 + 1, axis=1) - 1) * 2 + mean(w @ w.T)`,
  x f32[4, 8], w f32[8, 8]; with a NaN in one row of x, XLA under `xla_cpu_enable_fast_min_max`
  drops it in the reduce-max (the row's max is a number, not NaN).
- control_flow.mlir: `lax.cond` (stablehlo.case capturing outer values), a `lax.while_loop`
  carrying two values, then a reduce-max.
- sin_max.hlo: HLO text of `max(sin(x) * 2, axis=1)`, x f32[4, 8], as `--xla_dump_to` writes it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

FOLDER = Path(__file__).resolve().parent / "hlo"
FAST_MIN_MAX = {"xla.xla_cpu_enable_fast_min_max": True}


def nan_max_program() -> tuple[str, list[np.ndarray]]:
    """nan_max.mlir and its inputs: x with a NaN at [1, 2], w."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    x[1, 2] = np.nan
    w = rng.standard_normal((8, 8)).astype(np.float32)
    return (FOLDER / "nan_max.mlir").read_text(), [x, w]


def control_flow_program() -> str:
    return (FOLDER / "control_flow.mlir").read_text()


def hlo_text_program() -> str:
    return (FOLDER / "sin_max.hlo").read_text()


def write_program(folder: Path, text: str, arrays: list[np.ndarray] | None = None,
                  name: str = "program.mlir") -> tuple[Path, Path | None]:
    program = folder / name
    program.write_text(text)
    if arrays is None:
        return program, None
    inputs = folder / "inputs.npz"
    np.savez(inputs, *arrays)
    return program, inputs
