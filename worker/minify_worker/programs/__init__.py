"""What the engine reduces: one plug-in per kind of program (`Representation`).

The engine's loop, the scheduler and the sandbox know programs only through this protocol: the FX
graph of a `.pt2` (`programs/fx.py`) is one representation, and another kind of program (a
StableHLO module) adds a package beside it, not branches in the engine. A representation is two
halves: pure functions over a program in the engine's process (memo key, size, op kinds, its
strategies, the wire form a sandbox child gets), and entry points that run only in sandbox
children, named as call targets (`module:function`), because only children parse untrusted
programs and import compilers.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from minify_worker.outcomes import Outcome
    from minify_worker.programs.candidates import Tier

# The name every wire form carries under this key, so a child knows which representation runs it.
WIRE_KEY = "representation"

_MODULES = {"fx": "minify_worker.programs.fx", "stablehlo": "minify_worker.programs.stablehlo"}


class Representation(Protocol):
    """One kind of program the engine reduces. `Program` is whatever the representation holds in
    the engine's process (an `fx.Graph`, a parsed module's text); it never leaves it but as wire."""

    name: str
    # Sandbox call targets (`module:function`, run in a child as `fn(context, **kwargs) -> dict`):
    # `prepare_target(context, *, program, inputs)` parses the upload and writes program.json (the
    # wire form) and values.pt into `context.workdir` (loader.PreparedProgram), raising
    # `loader.ProgramError` for bad input; `artifacts_target` takes `artifacts.write_program_artifacts`'
    # keyword arguments and returns its `{"files": [...], "errors": {...}}`.
    prepare_target: str
    artifacts_target: str

    # -- the engine's process: pure, no compiler --------------------------------------------
    def key(self, program: Any) -> str:
        """A structural hash: candidates with the same key are the same test (the memo)."""

    def size(self, program: Any) -> tuple[int, ...]:
        """Smaller is better: a candidate counts only when its size is below the current one's."""

    def op_kinds(self, program: Any) -> frozenset[str]:
        """The kinds of op in `program` (the scheduler learns which kinds a failure needs)."""

    def count_ops(self, program: Any) -> int:
        """The op count reported as `nodes_original` / `nodes_final`."""

    def code(self, program: Any) -> str:
        """The program as text for progress events and report.json."""

    def passes(self) -> Sequence[Tier]:
        """The strategy tiers `scheduler.reduce` drives to a fixed point."""

    def empty(self, program: Any) -> Any:
        """`program` with no ops (its inputs returned): a failure it shares is not the program's."""

    def shape_hash(self, program: Any) -> str:
        """The program's structure without its sizes: with the signature, the bug a result files under."""

    def input_shapes(self, program: Any) -> dict[str, dict[str, Any]]:
        """Each input's shape and dtype, for report.json (`input_shapes_original` / `_final`)."""

    def to_wire(self, program: Any) -> dict[str, Any]:
        """JSON-safe form for a sandbox child; carries `WIRE_KEY: name`."""

    def from_wire(self, wire: dict[str, Any]) -> Any:
        """The inverse of `to_wire`."""

    # -- sandbox children only --------------------------------------------------------------
    def run_wire_candidate(self, wire: dict[str, Any], values: dict[str, Any], spec: Any, workdir: Any,
                           runs: int = 1) -> Outcome:
        """Build the candidate from its wire form, compile and run it `runs` times (compiled once),
        classify the result. Called in a sandbox child."""


class Shrinks(Protocol):
    """A representation that can shrink its inputs' sizes once the program is minimal (the shrink
    phase; one that cannot says so in the job's progress)."""

    def shrink(self, scheduler: Any, program: Any, *, dynamic: str, say: Any, on_accept: Any) -> Any:
        """Shrink `program`'s inputs while the failure holds, accepting each smaller program
        (`on_accept(program, description)`) and telling each step (`say(Milestone, message)`)."""


class HasCulprit(Protocol):
    """A representation whose compiler the culprit phase can bisect (culprit.py: inductor's)."""

    culprit_phase: bool


def representation(name: str) -> Representation:
    """The representation called `name` (`fx`, `stablehlo`), imported on first use."""
    try:
        module = importlib.import_module(_MODULES[name])
    except KeyError:
        raise ValueError(f"unknown program representation {name!r} (known: {', '.join(sorted(_MODULES))})") from None
    return module.REPRESENTATION


def of_format(program_format: str) -> Representation:
    """The representation of a job spec's `program_format`: a `.pt2` is FX; StableHLO and HLO text
    are both StableHLO (HLO is converted when it is loaded)."""
    return representation("fx" if program_format in ("pt2", "fx") else "stablehlo")


def of_wire(wire: dict[str, Any]) -> Representation:
    """The representation a wire form belongs to (FX when it names none: the older wire form)."""
    return representation(wire.get(WIRE_KEY, "fx"))
