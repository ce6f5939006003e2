"""The engine: minify one program, whatever its representation (docs/internals.md).

- `engine`: the phases of a run, in order (`minify`, the entry point, offline or in an RQ job).
- `budget`, `delivery`: the job's time and children; its ending, result and what is written.
- `original`, `target`, `hang`: the original's runs beside the reduction, its verdict, the hang watch.
- `evaluator`, `scheduler`: candidates tested in the sandbox, several at a time, to a fixed point.
- `progress`, `report`, `artifacts`, `workdirs`: what a run shows and delivers, and where it works.

Importing the package imports none of them: a sandbox child that needs the scheduler's or the
report's values gets those, not torch and the engine's threads. `minify`, `MinifyResult`,
`HangCalibration` and `default_parallelism` are looked up in their modules on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"minify": "engine", "MinifyResult": "delivery", "default_parallelism": "budget", "HangCalibration": "hang"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
