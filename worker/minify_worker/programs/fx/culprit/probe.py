"""A culprit probe, in its sandbox child: the minimal (or original) graph compiled with a backend
and settings, under the bisector's environment when it counts or disables a subsystem."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from minify_worker.outcomes import Invalid, outcome_to_dict
from minify_worker.programs.fx import bisector


def probe_in_child(context: Any, *, wire_graph: dict[str, Any], backend: str, config: dict[str, Any],
                   bisect_env: dict[str, str] | None = None, state_dir: str | None = None) -> dict[str, Any]:
    """A `SandboxPool.call` target: compile and run `wire_graph` with `backend` and the job's
    config plus `config`, under the bisector's environment when given; the outcome as a dict."""
    from minify_worker.programs.fx.run import build_candidate, run_candidate

    if bisect_env is not None:
        assert state_dir is not None
        bisector.enter_probe(bisect_env, Path(state_dir))
    spec = context.spec.model_copy(update={"backend": backend, "config": {**context.spec.config, **config}})
    try:
        gm, inputs = build_candidate(wire_graph, context.values)
    except Exception as error:
        return outcome_to_dict(Invalid(message=f"cannot build the probe: {type(error).__name__}: {error}"))
    return outcome_to_dict(run_candidate(gm, inputs, spec, Path(tempfile.gettempdir())))
