"""What the engine reduces: one plug-in per kind of program (`Representation`).

The engine's loop, the scheduler, the sandbox and the service know programs only through this
protocol and this registry: the FX graph of a `.pt2` (`programs/fx/`) is one representation, a
StableHLO module (`programs/stablehlo/`) another, and a new kind of program adds a package beside
them, not branches in the engine. Neither representation imports the other: what both need lives
here, above them (`candidates`, `prepared`, `classify`, `culprit`), or in the neutral modules
(`minify_worker.outcomes`, `oracle`, `artifacts`); tests/worker/test_layout.py checks it. A representation is two
halves: pure functions over a program in the engine's process (memo key, size, op kinds, its
strategies, the wire form a sandbox child gets), and entry points that run only in sandbox
children, named as call targets (`module:function`), because only children parse untrusted
programs and import compilers.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from minify_contract.models import CulpritState, JobSpec, Report
    from minify_worker.outcomes import Outcome, Signature
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
    # wire form) and values.pt into `context.workdir` (`prepared.PreparedProgram`), raising
    # `prepared.ProgramError` for bad input; `artifacts_target` takes the keyword arguments of
    # `programs/fx/artifacts.py`'s `write_program_artifacts` and returns its `{"files": [...], "errors": {...}}`.
    prepare_target: str
    artifacts_target: str

    # -- what it can do, as the engine, the service and the sandbox ask -----------------------
    # The job spec's `program_format`s whose uploads its loader reads (`of_format`).
    program_formats: tuple[str, ...]
    # Its culprit phase (`CulpritPhase`), or None: the phase is then `skipped` in report.json.
    culprit: CulpritPhase | None
    # Whether repro.py can run under other torch versions (the version phase, versions/).
    versions_phase: bool
    # Modules every candidate child imports: the fork server imports them once, before forking.
    child_modules: tuple[str, ...]
    # Whether a worker's origin process imports `child_modules` before any job (sandbox.preload):
    # children of every job then inherit them already imported.
    preloaded: bool

    def refusal(self, program: Path) -> str | None:
        """Why the upload `program` is refused, told from the file alone before any sandbox starts
        (no child, no compiler loaded: a user's mistake costs no job); None where only the
        loader's child can tell (it refuses the same uploads again)."""

    def check_upload(self, program: Path, spec: JobSpec) -> None:
        """In the engine's process, before the loader's child runs: make this process able to
        rebuild what the loader will write; raises `prepared.ProgramError` saying what is missing."""

    def set_up_children(self, spec: JobSpec) -> None:
        """In the fork server, before its first child: what every child of the job needs; raises
        `prepared.ProgramError` when the job cannot run here."""

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

    def shrink(self, scheduler: Any, program: Any, *, dynamic: str, say: Any, on_accept: Any) -> Any:
        """The shrink phase: shrink `program`'s inputs while the failure holds, accepting each smaller
        program (`on_accept(program, description)`) and telling each step (`say(Milestone, message)`),
        or saying why it cannot (`Milestone.shrink_skipped`)."""

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


class CulpritPhase(Protocol):
    """The culprit phase of a representation whose compiler can be bisected (FX: `programs/fx/culprit/`),
    run after the result was delivered."""

    def budget_s(self, elapsed_s: float) -> float:
        """How long the phase may take after a job that took `elapsed_s`."""

    def after_result(self, evaluator: Any, delivered: Report, out_dir: Path, *, original: Any, minimal: Any,
                     target: Signature, spec: JobSpec, timeout_s: float, budget: float,
                     should_stop: Callable[[], str | None], say: Callable[[str], None],
                     ) -> tuple[Report, CulpritState]:
        """Find the culprit and rewrite the delivered artifacts in `out_dir` with it."""


def representation(name: str) -> Representation:
    """The representation called `name` (`fx`, `stablehlo`), imported on first use."""
    try:
        module = importlib.import_module(_MODULES[name])
    except KeyError:
        raise ValueError(f"unknown program representation {name!r} (known: {', '.join(sorted(_MODULES))})") from None
    return module.REPRESENTATION


def of_format(program_format: str) -> Representation:
    """The representation whose loader reads a job spec's `program_format` (its `program_formats`):
    a `.pt2` and program.json are FX; StableHLO and HLO text are both StableHLO (HLO is converted
    when it is loaded)."""
    for kind in map(representation, sorted(_MODULES)):
        if program_format in kind.program_formats:
            return kind
    raise ValueError(f"no program representation reads program_format {program_format!r}")


def preloaded() -> list[Representation]:
    """The representations whose children's modules a worker's origin process imports ahead of jobs."""
    return [kind for kind in map(representation, sorted(_MODULES)) if kind.preloaded]


def import_modules(names: Sequence[str]) -> None:
    """Import `names` (a representation's `child_modules`) in this process."""
    for name in names:
        importlib.import_module(name)


def of_wire(wire: dict[str, Any]) -> Representation:
    """The representation a wire form belongs to (FX when it names none: the older wire form)."""
    return representation(wire.get(WIRE_KEY, "fx"))
