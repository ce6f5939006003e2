"""A StableHLO module as a representation (`programs.Representation`): the engine's half is pure
(`module.py`, `moves.py`); the child's half runs candidates (`run.py`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from minify_contract.models import JobSpec
from minify_worker.outcomes import Outcome
from minify_worker.programs import WIRE_KEY
from minify_worker.programs.candidates import Tier

from . import module as hlo
from .moves import PASSES
from .run import WIRE_MODULE

_PACKAGE = "minify_worker.programs.stablehlo"


class StablehloRepresentation:
    name = "stablehlo"
    program_formats = ("stablehlo", "hlo")  # HLO text is converted when it is loaded
    # Sandbox call targets (`SandboxPool.call`) for the engine: the loader and the artifact writer.
    prepare_target = f"{_PACKAGE}.prepare:prepare_in_child"
    artifacts_target = f"{_PACKAGE}.artifacts:write_program_artifacts"
    culprit = None  # the culprit phase bisects torch's compiler
    versions_phase = False  # repro.py needs jax, not torch
    # jax (0.7 s a child otherwise) and the candidate runner. Imports only: jax starts no thread
    # until a child makes its backend. Not in a worker's origin: an inductor job's children need none.
    child_modules = ("jax.extend", f"{_PACKAGE}.run")
    preloaded = False

    def refusal(self, program: Path) -> str | None:
        """None: a module is told good or bad by parsing it, the loader's child's work."""
        return None

    def check_upload(self, program: Path, spec: JobSpec) -> None:
        """Nothing to import: a module names no Python code."""

    def set_up_children(self, spec: JobSpec) -> None:
        """Nothing beyond `child_modules`."""

    def key(self, program: hlo.Module) -> str:
        return hlo.key(program)

    def size(self, program: hlo.Module) -> tuple[int, ...]:
        return hlo.size(program)

    def op_kinds(self, program: hlo.Module) -> frozenset[str]:
        return hlo.op_kinds(program)

    def count_ops(self, program: hlo.Module) -> int:
        return len(program.ops)

    def code(self, program: hlo.Module) -> str:
        return hlo.display(program)

    def passes(self) -> Sequence[Tier]:
        return PASSES

    def empty(self, program: hlo.Module) -> hlo.Module:
        return hlo.empty(program)

    def shape_hash(self, program: hlo.Module) -> str:
        return hlo.shape_hash(program)

    def input_shapes(self, program: hlo.Module) -> dict[str, dict[str, Any]]:
        return hlo.input_shapes(program)

    def shrink(self, scheduler: Any, program: hlo.Module, *, dynamic: str, say: Any, on_accept: Any) -> None:
        """The shrink phase (`shrink.py`): halve the minimal module's tensor sizes while it fails."""
        from .shrink import shrink

        shrink(scheduler, program, say=say, on_accept=on_accept)

    def to_wire(self, program: hlo.Module) -> dict[str, Any]:
        return {WIRE_KEY: self.name, WIRE_MODULE: hlo.to_wire(program)}

    def from_wire(self, wire: dict[str, Any]) -> hlo.Module:
        return hlo.from_wire(wire[WIRE_MODULE])

    def run_wire_candidate(self, wire: dict[str, Any], values: dict[str, Any], spec: Any, workdir: Any,
                           runs: int = 1) -> Outcome:
        from .run import run_wire_candidate

        return run_wire_candidate(wire, values, spec, Path(workdir), runs)


REPRESENTATION = StablehloRepresentation()
