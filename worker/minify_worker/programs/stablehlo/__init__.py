"""StableHLO and HLO programs (issue 32): what an XLA compiler fails on, minimized to a small
module and a repro that needs only jax.

- `module.py`: the program as the engine holds it (main's ops as text, pure); `surgery.py`:
  candidates as subsets of its ops; `moves.py`: the strategies;
- `parse.py`: reading MLIR text or bytecode, VHLO, HLO text (sandbox children only);
- `prepare.py`: the loader (`prepare_target`): program.json and the value store;
- `shrink.py`: the shrink phase (tensor sizes halved once the module is minimal);
- `run.py`, `xla.py`, `command.py`, `accuracy.py`: one candidate compiled and run, classified;
- `artifacts.py`: minimized.mlir, minimized.hlo, inputs.npz, repro.py (`artifacts_target`);
- `arrays.py`: arrays between MLIR types, numpy and torch.
"""

from .representation import REPRESENTATION, StablehloRepresentation

__all__ = ["REPRESENTATION", "StablehloRepresentation"]
