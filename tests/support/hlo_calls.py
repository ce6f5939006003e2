"""`SandboxPool.call` targets for the HLO minifier's tests: what compiles (XLA) or converts HLO
runs in a sandbox child, never in the test process (tests/support/hlo_programs.py says why).
Pools allow them with `env=ALLOWED`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from minify_contract.models import JobSpec
from minify_worker.outcomes import outcome_to_dict
from minify_worker.programs.stablehlo import REPRESENTATION, parse, prepare, xla
from minify_worker.programs.stablehlo.module import render, to_wire
from minify_worker.sandbox import ALLOWED_CALLS_ENV, ChildContext

PREFIX = "tests.support.hlo_calls"
ALLOWED = {ALLOWED_CALLS_ENV: PREFIX}


def prepare_program(context: ChildContext, *, program: str, inputs: str | None, workdir: str) -> dict[str, Any]:
    """`prepare.prepare` into `workdir`; a `ProgramError` comes back as the call's error."""
    return prepare.prepare(Path(program), None if inputs is None else Path(inputs), Path(workdir))


def run_candidate(context: ChildContext, *, wire: dict[str, Any], values: str, spec_json: str, runs: int = 1,
                  environment: dict[str, str] | None = None) -> dict[str, Any]:
    """The representation's candidate run on a wire form, with the value store at `values`."""
    import torch

    os.environ.update(environment or {})
    store = torch.load(values, weights_only=True)
    spec = JobSpec.model_validate_json(spec_json)
    return {"outcome": outcome_to_dict(REPRESENTATION.run_wire_candidate(wire, store, spec, context.workdir, runs))}


def read_program(context: ChildContext, *, path: str) -> dict[str, Any]:
    """The program at `path` as `module.to_wire` writes it (HLO text converted)."""
    return to_wire(parse.read(Path(path).read_bytes()))


def same_outputs(context: ChildContext, *, original: str, inputs: str) -> dict[str, Any]:
    """Whether the module at `original`, read and rendered again, computes what it does (XLA)."""
    text = Path(original).read_text()
    with np.load(inputs) as archive:
        arrays = [archive[name] for name in archive.files]
    again = xla.compile_module(render(parse.read(text.encode())), {})(arrays)
    want = xla.compile_module(text, {})(arrays)
    return {"same": all(np.array_equal(a, b, equal_nan=True) for a, b in zip(again, want, strict=True)),
            "outputs": len(want)}


def write_artifacts(context: ChildContext, *, values: str, file_size_limit: int | None = None,
                    **kwargs: Any) -> dict[str, Any]:
    """The artifact writer with the value store at `values`, under a file size limit if given
    (a disk that refuses files larger than that: EFBIG)."""
    import resource
    import signal

    import torch

    from minify_worker.programs.stablehlo.artifacts import write_program_artifacts
    from minify_worker.sandbox import ChildContext as Context

    if file_size_limit is not None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))
    store = torch.load(values, weights_only=True)
    return write_program_artifacts(Context(context.workdir, context.spec, store), **kwargs)
