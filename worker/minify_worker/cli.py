"""`minify-worker`: the offline engine (`minify-worker minify ...`) or an RQ worker (anything else)."""

from __future__ import annotations

import argparse
import atexit
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from minify_contract.models import CulpritState, JobState, OriginalState, ProgressEvent, Report, detect_program_format
from minify_contract.specflags import SpecError, add_spec_arguments, spec_from_args
from minify_contract.summaries import culprit_summary, not_reproduced_lines, original_summary, shrunk_inputs
from minify_worker import programs
from minify_worker.sandbox.limits import worker_parallelism

if TYPE_CHECKING:
    from minify_worker.engine import MinifyResult

EXIT_TERMINATED = 128 + signal.SIGTERM
EXIT_CODES = {
    JobState.succeeded: 0,
    JobState.not_reproducible: 3,
    JobState.failed: 1,
    JobState.cancelled: 1,
}


def main(argv: list[str] | None = None) -> int:
    as_program = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "minify":
        code = minify_command(argv[1:])
        if as_program:
            _exit_without_teardown(code)
        return code
    from minify_worker.service import rqworker

    return rqworker.main(argv)


def _exit_without_teardown(code: int) -> None:
    """End the offline command once its job is done and its output written: the interpreter's
    teardown of torch (freeing every module's objects, libtorch's static destructors) took 1.3-1.5
    s from the job's last event to the exit (0.1-0.16 s without it), on the critical path of a CI
    step. The job's own cleanup (sandbox, work dir) is done by then; the atexit handlers still run."""
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()  # what a normal exit runs first: logging's flush, finalizers
    os._exit(code)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minify-worker minify",
        description="Minify a failing torch.export program offline (no Redis), every candidate in a sandbox child.",
    )
    parser.add_argument("program", type=Path, help="a .pt2 from torch.export.save (or a pickled GraphModule "
                        "where MINIFY_ALLOW_PICKLE=1), minify's program.json (a capture's, or a minimized.json), "
                        "or a StableHLO module (.mlir, bytecode, VHLO) or HLO text "
                        "(docs/hlo.md), told apart by suffix or content unless the spec's program_format says")
    parser.add_argument("--inputs", type=Path, help="inputs .pt (torch.save of args, (args, kwargs) or a kwargs "
                        "dict; for a program.json every placeholder's value by name, or in order); for StableHLO or "
                        "HLO an .npz of main's arguments")
    parser.add_argument("--out", type=Path, required=True, help="where minimized.pt2, repro.py, ... go")
    parser.add_argument("--json", action="store_true", help="print report.json instead of a summary")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    add_spec_arguments(parser)
    return parser


def minify_command(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        spec = spec_from_args(args)
    except SpecError as error:
        parser.error(str(error))
    if not args.program.is_file():
        parser.error(f"{args.program}: no such file")
    if args.inputs is not None and not args.inputs.is_file():
        parser.error(f"{args.inputs}: no such file")
    if spec.limits.parallelism is None:
        try:
            worker_parallelism()  # the default of a job without --parallelism
        except ValueError as error:
            parser.error(f"{error} (or pass --parallelism)")
    if "program_format" not in spec.model_fields_set:
        with args.program.open("rb") as file:
            spec = spec.model_copy(update={"program_format": detect_program_format(args.program.name, file.read(64))})

    from minify_worker.engine import minify
    from minify_worker.sandbox import preload

    # As the RQ worker does at start: the job's fork server is then forked from this process, warm.
    # Not for an upload the file alone shows is refused: the engine says why, with no sandbox.
    if programs.of_format(spec.program_format).refusal(args.program) is None:
        preload(warm=spec.backend in ("inductor", "aot_inductor") and spec.device_class == "cpu")
    cancel = threading.Event()
    terminated = threading.Event()

    def terminate(signum: int, frame: object) -> None:
        """SIGTERM: stop as a cancel does, so the sandbox children die and the job folder goes."""
        terminated.set()
        cancel.set()

    signal.signal(signal.SIGTERM, terminate)
    display = _ProgressDisplay(enabled=not args.quiet and not args.json)
    delivered = []

    def deliver(result: MinifyResult) -> None:
        """The result first (the --out files are written): the summary, then the culprit phase."""
        delivered.append(result)
        if not args.json:
            display.pause()
            _print_summary(result, args.out.resolve())
            sys.stdout.flush()

    try:
        with display:
            result = minify(args.program, spec, args.out.resolve(), inputs=args.inputs, on_event=display.update,
                            cancel=cancel, on_result=deliver)
    except KeyboardInterrupt:
        cancel.set()
        print("interrupted", file=sys.stderr)
        return 130
    if terminated.is_set():
        print("terminated", file=sys.stderr)
        return EXIT_TERMINATED
    if not delivered and not args.json:
        _print_summary(result, args.out.resolve())  # the result first, then the version phase
        sys.stdout.flush()
    report = result.report
    if spec.versions and programs.of_format(spec.program_format).versions_phase and result.status is JobState.succeeded:
        report = _version_phase(report, args.out.resolve(), display)
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        if report.versions_compared and report.versions_summary:
            print(f"versions: {report.versions_summary}")
        followed = delivered[0].report if delivered else None  # what the delivered result said would follow
        if followed and followed.original_state is OriginalState.running:
            print(original_summary(report))
        if followed and followed.culprit_state is CulpritState.running:
            print(culprit_summary(report) or f"culprit: {report.culprit_state}")
    return EXIT_CODES[result.status]


def _version_phase(report: Report, out_dir: Path, display: _ProgressDisplay) -> Report:
    """repro.py under every torch this command has (its own, MINIFY_TORCH_ENVS, MINIFY_TORCH_INDEX's
    installed ones), after the culprit phase; report.json and repro.py's header rewritten."""
    from minify_worker.service.versions import phase

    envs = phase.offered_envs()
    if len(envs) > 1:
        display.update(ProgressEvent(type="log", phase="versions", elapsed_s=report.elapsed_s,
                                     message=f"running repro.py on torch {', '.join(env.torch for env in envs[1:])}"))
    found = phase.run_locally(out_dir, report, envs)
    phase.write_findings(out_dir, found)
    return found


def _print_summary(result: MinifyResult, out_dir: Path) -> None:
    report = result.report
    print(f"status: {report.status.value}" + (f" ({report.reason})" if report.reason else ""))
    if report.signature:
        print(f"signature: {report.signature}")
    if report.nodes_original is not None:
        print(f"ops: {report.nodes_original} -> {report.nodes_final}   checks: {report.checks_total} "
              f"({report.checks_cached} cached)   {report.elapsed_s:.1f}s")
    inputs = shrunk_inputs(report)
    if inputs:
        print(inputs)
    # A verdict to say: it follows the delivered result, or contradicts it (a confirmed one goes unsaid).
    told = report.status is JobState.succeeded and report.original_state not in (None, OriginalState.confirmed)
    for line in (original_summary(report) if told else None, culprit_summary(report),
                 *not_reproduced_lines(report)):
        if line:
            print(line)
    if report.graph_code:
        print(report.graph_code.rstrip())
    if result.artifacts:
        print(f"artifacts in {out_dir}: {', '.join(sorted(result.artifacts))}")


class _ProgressDisplay:
    """A rich progress bar at a terminal, plain lines elsewhere (CI logs)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._progress = None
        self._task = None
        self._last_line: tuple | None = None
        self._last_message: str | None = None

    def __enter__(self) -> _ProgressDisplay:
        if self.enabled and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("[bold]{task.fields[phase]:<22}"),
                BarColumn(),
                TextColumn("{task.fields[nodes]} ops"),
                TextColumn("{task.fields[checks]} checks"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
            )
            self._progress.start()
            self._task = self._progress.add_task("minify", total=1, phase="starting", nodes="?", checks=0)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def pause(self) -> None:
        """Stop the bar while the summary prints; later events (the culprit phase) go as plain lines."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def update(self, event: ProgressEvent) -> None:
        if not self.enabled:
            return
        nodes = f"{event.nodes_current}/{event.nodes_original}" if event.nodes_original else "?"
        checks = f"{event.checks_total} ({event.checks_cached} cached)"
        if self._progress is not None and self._task is not None:
            total = max(1, (event.nodes_original or 1) - 1)
            done = (event.nodes_original or 1) - (event.nodes_current or event.nodes_original or 1)
            self._progress.update(self._task, total=total, completed=done, phase=event.phase, nodes=nodes,
                                  checks=checks)
            return
        line = (event.phase, event.nodes_current, event.status)
        # A new message counts too: the shrink phase's steps change neither phase nor op count.
        fresh_message = event.message is not None and event.message != self._last_message
        if line != self._last_line or event.type != "progress" or fresh_message:
            self._last_line, self._last_message = line, event.message or self._last_message
            text = event.message or ""
            print(f"[{event.elapsed_s:7.1f}s] {event.phase:<22} ops {nodes:<9} checks {checks} {text}".rstrip(),
                  file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
