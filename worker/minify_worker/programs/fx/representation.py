"""The FX graph of a `torch.export` program as a representation (`programs.Representation`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch.fx as fx

from minify_contract.models import JobSpec, Milestone
from minify_worker.outcomes import Outcome
from minify_worker.programs import WIRE_KEY, CulpritPhase
from minify_worker.programs.fx import graph, moves, shrink
from minify_worker.programs.prepared import ProgramError

_PACKAGE = "minify_worker.programs.fx"


class FxRepresentation:
    name = "fx"
    program_formats = ("pt2", "fx_json")  # a torch.export archive, or program.json (prepare.py)
    prepare_target = f"{_PACKAGE}.prepare:prepare_in_child"
    artifacts_target = f"{_PACKAGE}.artifacts:write_program_artifacts"
    versions_phase = True
    # The runner and its backends (torch's compiler stack is every child's: sandbox/warmup.py), and
    # what imports the spec's op_modules in the fork server and the engine's process (set_up_children,
    # check_upload): it imports minify_client's package, a quarter of a CPU-s in each of a job's two
    # processes where the worker's preload had not imported it already.
    child_modules = (f"{_PACKAGE}.backends", f"{_PACKAGE}.run", f"{_PACKAGE}.op_modules")
    preloaded = True

    @property
    def culprit(self) -> CulpritPhase:
        """torch's compiler bisector and the settings that avoid the bug (culprit/)."""
        from minify_worker.programs.fx import culprit

        return culprit

    def refusal(self, program: Path) -> str | None:
        """A .pt2 that is no readable torch.export archive, or whose loading would run code
        (prepare.py's `refusal`); a program.json is the loader's to check."""
        from minify_worker.programs.fx.prepare import refusal

        return refusal(Path(program))

    def check_upload(self, program: Path, spec: JobSpec) -> None:
        """The spec's `op_modules` imported here, which rebuilds the prepared graph whose targets
        their custom ops are: one the worker does not allow, or that does not import, is a
        `ProgramError` naming it and the program's custom ops (`op_modules.import_op_modules`)."""
        from minify_worker.programs.fx.op_modules import OpModuleError, custom_ops_of_program, import_op_modules

        try:
            import_op_modules(spec.op_modules, custom_ops_of_program(Path(program)) if spec.op_modules else ())
        except OpModuleError as error:
            raise ProgramError(str(error)) from None

    def set_up_children(self, spec: JobSpec) -> None:
        """Every child needs the program's custom ops registered: the spec's `op_modules` imported."""
        from minify_worker.programs.fx.op_modules import OpModuleError, import_op_modules

        try:
            import_op_modules(spec.op_modules)
        except OpModuleError as error:
            raise ProgramError(str(error)) from None

    def key(self, program: fx.Graph) -> str:
        return graph.structural_hash(program)

    def size(self, program: fx.Graph) -> tuple[int, ...]:
        return graph.size_key(program)

    def op_kinds(self, program: fx.Graph) -> frozenset[str]:
        return frozenset(graph.target_name(node.target) for node in program.nodes if node.op == "call_function")

    def count_ops(self, program: fx.Graph) -> int:
        return graph.count_ops(program)

    def code(self, program: fx.Graph) -> str:
        return graph.graph_code(program)

    def passes(self) -> Sequence[moves.Tier]:
        return moves.PASSES

    def empty(self, program: fx.Graph) -> fx.Graph:
        empty = fx.Graph()
        inputs = []
        for node in graph.placeholders(program):
            copy = empty.node_copy(node)
            copy.meta = dict(node.meta)
            inputs.append(copy)
        empty.output(tuple(inputs)).meta = dict(graph.output_node(program).meta)
        return empty

    def shape_hash(self, program: fx.Graph) -> str:
        return graph.graph_shape_hash(program)

    def input_shapes(self, program: fx.Graph) -> dict[str, dict[str, Any]]:
        return shrink.input_shapes(program)

    def shrink(self, scheduler: Any, program: fx.Graph, *, dynamic: str, say: Callable[[Milestone, str], None],
               on_accept: Callable[[fx.Graph, str], None]) -> None:
        """The shrink phase (shrink.py): halve the minimal graph's tensor inputs while the failure
        holds; a graph it cannot shrink says why."""
        skipped = shrink.not_shrinkable(program, dynamic)
        if skipped:
            say(Milestone.shrink_skipped, f"shrink skipped: {skipped}")
            return
        kept = shrink.kept_inputs(program)
        say(Milestone.shrink_started, f"shrinking {shrink.shapes_text(program)}"
            + (f"; kept as they are (not tensors): {', '.join(kept)}" if kept else ""))
        done = shrink.shrink(scheduler, program, on_accept=on_accept)
        say(Milestone.shrunk, f"shrunk to {shrink.shapes_text(done.graph)} in {done.checks} checks" if done.accepted
            else f"no input could shrink ({done.checks} checks)")

    def to_wire(self, program: fx.Graph) -> dict[str, Any]:
        return {**graph.graph_to_wire(program), WIRE_KEY: self.name}

    def from_wire(self, wire: dict[str, Any]) -> fx.Graph:
        return graph.graph_from_wire(wire)

    def run_wire_candidate(self, wire: dict[str, Any], values: dict[str, Any], spec: Any, workdir: Any,
                           runs: int = 1) -> Outcome:
        from minify_worker.programs.fx.run import run_wire_candidate

        return run_wire_candidate(wire, values, spec, workdir, runs)


REPRESENTATION = FxRepresentation()
