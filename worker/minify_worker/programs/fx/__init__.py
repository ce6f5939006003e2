"""The FX graph of a `torch.export` program (a `.pt2`): what a torch compiler fails on, minimized
to a small graph and a repro that needs only torch.

- `graph/`: the flat graph as the engine holds it, its surgery, hashes and wire form (pure);
  `moves.py`: the strategies (candidates as smaller graphs);
- `prepare.py` (`prepare_target`), `export_load.py`, `op_modules.py`: reading a `.pt2` (or a
  pickled GraphModule) and its inputs into program.json and the value store (sandbox children only);
- `shrink.py`: the shrink phase (input sizes halved once the graph is minimal);
- `run.py`, `backends.py`: one candidate compiled with the job's backend and run, classified;
- `culprit/`, `bisector.py`: the culprit phase (torch's compiler bisector, settings that avoid the bug);
- `artifacts.py` (`artifacts_target`), `repro.py`: minimized.pt2, inputs.pt, repro.py;
- `representation.py`: all of it as a `programs.Representation`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["REPRESENTATION", "FxRepresentation"]


def __getattr__(name: str) -> Any:
    # The representation imports torch; the package itself must not: a spawned fork server reads
    # op_modules (the allowlist of custom-op modules) before torch is imported.
    if name in __all__:
        from . import representation

        return getattr(representation, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
