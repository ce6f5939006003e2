"""`minify-client`: submit a failing program, follow it, fetch the repro (README.md, docs/client.md).

Exit codes: 0 minimized (or the command did what it was asked), 3 not reproducible, 1 failed,
cancelled or an error talking to the server, 2 usage, 130 interrupted.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from minify_client.client import (
    DEFAULT_RETRY_FOR_S,
    RETRY_FOR_ENV,
    Client,
    parse_retry_for,
    retry_for_from_environment,
)
from minify_client.errors import ApiError, BadRequest, MinifyError
from minify_client.progress import progress_view
from minify_contract.archive import describe_unsafe_members, find_unsafe_members
from minify_contract.config_schema import config_mistake
from minify_contract.models import (
    Bug,
    BugChange,
    CulpritState,
    JobSpec,
    JobState,
    JobStatus,
    ProgressEvent,
    Report,
    detect_program_format,
)
from minify_contract.program_json import ProgramJsonError, read_document
from minify_contract.specflags import SpecError, add_spec_arguments, spec_from_args
from minify_contract.summaries import (
    CULPRIT_STARTED,
    bisect_summary,
    culprit_summary,
    not_reproduced_lines,
    original_output_lines,
    original_summary,
    shrunk_inputs,
    summary,
    versions_summary,
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_REPRODUCIBLE = 3
EXIT_INTERRUPTED = 130

EXIT_CODES = {
    JobState.succeeded: EXIT_OK,
    JobState.not_reproducible: EXIT_NOT_REPRODUCIBLE,
    JobState.failed: EXIT_FAILED,
    JobState.cancelled: EXIT_FAILED,
}


class UsageError(Exception):
    """The command line asks for something that cannot be done (exit 2)."""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command: Callable[[argparse.Namespace], int] = args.run
    try:
        return command(args)
    except BrokenPipeError:  # `minify-client list | head`: the reader had enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return EXIT_OK
    except (UsageError, SpecError) as error:
        return _fail(str(error), EXIT_USAGE)
    except BadRequest as error:
        return _fail(f"the server refused the request ({error.status_code}): {error.message}", EXIT_USAGE)
    except ApiError as error:
        return _fail(f"the server answered {error.status_code}: {error.message}", EXIT_FAILED)
    except MinifyError as error:
        return _fail(str(error), EXIT_FAILED)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def build_parser() -> argparse.ArgumentParser:
    connection = argparse.ArgumentParser(add_help=False)
    connection.add_argument("--server", metavar="URL",
                            help="the minify server (default: $MINIFY_SERVER or http://127.0.0.1:8000)")
    connection.add_argument("--token", help="API token (default: $MINIFY_TOKEN)")
    connection.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")
    connection.add_argument("--retry-for", type=_retry_for, metavar="SECONDS",
                            help="how long to keep retrying while the server is unreachable (a restart) "
                            f"before giving up; 0: give up at once (default: ${RETRY_FOR_ENV} or "
                            f"{DEFAULT_RETRY_FOR_S:g})")

    parser = argparse.ArgumentParser(
        prog="minify-client",
        description="Submit a failing PyTorch program to a minify server and fetch the smallest "
        "program that still fails the same way.",
        epilog="exit codes: 0 minimized, 3 not reproducible, 1 failed or error, 2 usage, 130 interrupted",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    submit = commands.add_parser("submit", parents=[connection], help="post a failing .pt2 program",
                                 description="Post a failing torch.export program (.pt2), minify's program.json "
                                 "(what a capture writes where torch.export.save refuses the program: docs/client.md), "
                                 "or a StableHLO module or HLO text an XLA compiler fails on (docs/hlo.md).")
    submit.add_argument("program", type=Path, metavar="PROGRAM.pt2")
    add_spec_arguments(submit)
    _add_inputs_argument(submit)
    submit.add_argument("--wait", action="store_true",
                        help="follow the job, download its artifacts and print the minimized graph")
    submit.add_argument("--out", type=Path, metavar="DIR",
                        help="where --wait puts the artifacts (default: ./minify-JOB_ID)")
    _add_wait_culprit_argument(submit)
    submit.add_argument("--force", action="store_true",
                        help="a new job even when the same program, spec and inputs already have one "
                        "(queued, running or succeeded)")
    submit.set_defaults(run=_submit)

    status = commands.add_parser("status", parents=[connection], help="show a job")
    status.add_argument("job_id", metavar="ID")
    status.set_defaults(run=_status)

    watch = commands.add_parser("watch", parents=[connection], help="follow a job until it ends")
    watch.add_argument("job_id", metavar="ID")
    watch.add_argument("--out", type=Path, metavar="DIR", help="download the artifacts here when it ends")
    _add_wait_culprit_argument(watch)
    watch.set_defaults(run=_watch)

    download = commands.add_parser("download", parents=[connection], help="download a job's artifacts",
                                   description="Download a finished job's artifacts into a folder: minimized.pt2, "
                                   "repro.py (with signature_rules.py beside it), inputs.pt and report.json by "
                                   "default, bundle.tar.gz (all of them in one file) when named.")
    download.add_argument("job_id", metavar="ID", help="the job (as submit printed it)")
    download.add_argument("--out", type=Path, metavar="DIR", help="where the files go (default: ./minify-JOB_ID)")
    download.add_argument("--name", action="append", metavar="NAME",
                          help="one artifact (minimized.pt2, repro.py, signature_rules.py, inputs.pt, report.json, "
                          "bundle.tar.gz); repeatable; default: all but the bundle")
    download.set_defaults(run=_download)

    cancel = commands.add_parser("cancel", parents=[connection], help="cancel a job")
    cancel.add_argument("job_id", metavar="ID")
    cancel.set_defaults(run=_cancel)

    bisect = commands.add_parser(
        "bisect", parents=[connection], help="narrow a job's regression to the first bad torch release",
        description="Install the torch releases between GOOD and BAD from a worker's index (MINIFY_TORCH_INDEX) "
                    "and run the job's repro.py under each, halving the range: at most log2(N)+2 installs.")
    bisect.add_argument("job_id", metavar="ID")
    bisect.add_argument("--good", required=True, metavar="VERSION", help="a torch version the repro passes on")
    bisect.add_argument("--bad", required=True, metavar="VERSION", help="a newer one it fails on the same way")
    bisect.add_argument("--no-wait", dest="wait", action="store_false", help="start it and return")
    bisect.set_defaults(run=_bisect)

    listing = commands.add_parser("list", parents=[connection], help="list jobs, newest first")
    listing.add_argument("--status", choices=[state.value for state in JobState])
    listing.add_argument("--limit", type=int, default=20)
    listing.set_defaults(run=_list)

    bugs = commands.add_parser(
        "bugs", parents=[connection], help="list, show, close or reopen bugs",
        usage="minify-client bugs [ID | close ID --reason WHY | reopen ID --reason WHY] [options]",
        description="Succeeded jobs grouped by root-cause signature and minimal graph shape: `bugs` lists them (most "
        "recently seen first), `bugs ID` shows one, `bugs close ID --reason WHY` closes it and `bugs reopen ID "
        "--reason WHY` reopens it. A bug closed as fixed is reopened (regressed) by the next job that finds it; "
        "one closed as wont_fix or not_a_bug stays closed.")
    bugs.add_argument("words", nargs="*", metavar="ID", help=argparse.SUPPRESS)
    bugs.add_argument("--limit", type=int, default=20)
    bugs.add_argument("--status", choices=["open", "fixed", "closed"],
                      help="open, fixed (a newer torch passes its repro) or closed (by hand)")
    bugs.add_argument("--reason", help="close, reopen: why (required)")
    bugs.add_argument("--resolution", choices=["fixed", "wont_fix", "not_a_bug"], default="fixed",
                      help="close: fixed (default: a job that finds it again reopens it), wont_fix or not_a_bug "
                      "(it stays closed)")
    bugs.add_argument("--by", help="close, reopen: who, recorded by a server without tokens (default: the OS user; "
                      "a server with tokens records the token's name)")
    bugs.set_defaults(run=_bugs)

    logs = commands.add_parser("logs", parents=[connection], help="show a job's log: what the worker logged",
                               description="What the worker logged while it ran the job (every attempt): the "
                               "sandbox's restarts and faults, the last output of children that died, warnings and "
                               "errors with their tracebacks.")
    logs.add_argument("job_id", metavar="ID")
    logs.add_argument("--tail", type=int, default=200, metavar="N", help="the last N lines (default 200, at most 5000)")
    logs.set_defaults(run=_logs)

    captures = commands.add_parser(
        "submit-captures", parents=[connection], help="post every failing program a capture run saved",
        description="Post each capture listed in DIR/captures.json (pytest plugin, python -m minify_client.capture) "
        "with its spec and inputs. Exit code: 1 if a job failed, else 3 if one was not reproducible, else 0.")
    captures.add_argument("directory", type=Path, metavar="DIR")
    captures.add_argument("--wait", action="store_true", help="follow each job and download its artifacts")
    _add_wait_culprit_argument(captures)
    captures.add_argument("--out", type=Path, metavar="DIR",
                          help="where --wait puts the artifacts, one folder per capture (default: ./minify-repros)")
    captures.set_defaults(run=_submit_captures)

    from minify_client import reduce  # imports no torch

    reducing = commands.add_parser(
        "reduce", help="shrink a failing script no captured graph holds (runs it here, not on a server)",
        description=reduce.DESCRIPTION + " Each candidate runs here in a process of its own, twice at most: with "
        "torch.compile and without it. Exit code: 0 reduced, 2 the script passes or fails without torch.compile.")
    reduce.add_arguments(reducing)
    reducing.set_defaults(run=reduce.run_command)
    return parser


def _add_wait_culprit_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-wait-culprit", dest="wait_culprit", action="store_false",
                        help="with --wait: stop once the repro is downloaded, without waiting for the culprit phase "
                        "(it runs after the result is delivered: the culprit and workarounds lines, report.json "
                        "and repro.py refreshed); by default --wait waits for it, and Ctrl-C during it exits 0")


def _add_inputs_argument(parser: argparse.ArgumentParser) -> None:
    try:
        parser.add_argument("--inputs", type=Path, metavar="FILE",
                            help="real inputs (.pt) to run the program with, instead of its example inputs "
                            "(an .npz of main's arguments for StableHLO or HLO)")
    except argparse.ArgumentError:
        pass  # the shared spec flags already define it


# ---- commands ---------------------------------------------------------------------------------


def _submit(args: argparse.Namespace) -> int:
    if not args.program.is_file():
        raise UsageError(f"no such program file: {args.program}")
    if args.inputs is not None and not args.inputs.is_file():
        raise UsageError(f"no such inputs file: {args.inputs}")
    spec = spec_from_args(args)
    if "program_format" not in spec.model_fields_set:  # a StableHLO module or HLO text: told by suffix or content
        with args.program.open("rb") as file:
            spec = spec.model_copy(update={"program_format": detect_program_format(args.program.name, file.read(64))})
    if spec.program_format == "fx_json":
        _check_program_json(args.program, args.inputs)
    _warn_if_it_runs_code(args.program)
    with _client(args) as client:
        created = client.submit(args.program, spec, inputs=args.inputs, force=args.force)
        out_dir = (args.out or Path(f"minify-{created.id}")) if args.wait else args.out
        # The job exists from here on: a Ctrl-C at any moment (printing, setting up the progress bar,
        # following, downloading) says which job it was and how to pick it up again.
        try:
            for warning in created.warnings:
                print(f"minify-client: warning: {warning}", file=sys.stderr)
            if created.deduplicated:
                print(f"minify-client: same program as job {created.id} ({created.status.value}); "
                      "--force makes a new job", file=sys.stderr)
            dashboard = client.dashboard_url(created)
            if not args.wait:
                if args.json:
                    _print_json({**created.model_dump(mode="json"), "dashboard": dashboard})
                else:
                    print(created.id)
                    print(f"dashboard: {dashboard}")
                return EXIT_OK
            _progress_stream(args).write(f"submitted job {created.id}: {dashboard}\n")
            return _follow(client, created.id, args, out_dir)
        except KeyboardInterrupt:
            return _interrupted(created.id, args, out_dir)


RESOLUTION_WORDS = {"fixed": "fixed", "wont_fix": "won't fix", "not_a_bug": "not a bug"}


def _bug_status(bug: Bug) -> str:
    """`open`, `open (regressed: job J found it again ...)`, `closed (won't fix) by alice: why`, or
    `fixed in 2.15.0 (re-test of job J passed on it)`."""
    if bug.status == "closed" and bug.closure is not None:
        closure = bug.closure
        since = f"; {bug.jobs_since_closed} jobs found it since" if bug.jobs_since_closed else ""
        return (f"closed ({RESOLUTION_WORDS.get(closure.resolution or 'fixed')}) by {closure.by or 'someone'} "
                f"{closure.at:%Y-%m-%d %H:%M}: {closure.reason}{since}")
    if bug.status != "fixed":
        regressed = bug.history[-1] if bug.history and bug.history[-1].action == "regressed" else None
        return f"open (regressed: {regressed.reason})" if regressed else "open"
    evidence = bug.fixed_evidence
    how = f" ({evidence.how}: job {evidence.job}'s repro passed on it)" if evidence else ""
    return f"fixed in {bug.fixed_in}{how}"


def _bug_status_cell(bug: Bug) -> str:
    """The list's STATUS: `open`, `regressed`, `closed: won't fix`, `fixed in 2.15.0`."""
    if bug.status == "closed" and bug.closure is not None:
        return f"closed: {RESOLUTION_WORDS.get(bug.closure.resolution or 'fixed')}"
    if bug.status == "fixed":
        return f"fixed in {bug.fixed_in}"
    return "regressed" if bug.history and bug.history[-1].action == "regressed" else "open"


def _known_fixed(client: Client, signature: str | None, fixed: list[Bug]) -> str | None:
    """`known bug B, fixed in torch X` for a capture whose signature a fixed bug has."""
    if signature is None:
        return None
    for bug in fixed:
        if bug.signature == signature:
            return f"known bug {bug.id}, fixed in torch {bug.fixed_in} ({client.server}{bug.dashboard or ''})"
    return None


def _submit_captures(args: argparse.Namespace) -> int:
    from minify_client.capture.session import read_manifest, record_job  # imports no torch

    if not args.directory.is_dir():
        raise UsageError(f"no such capture directory: {args.directory}")
    try:
        entries = read_manifest(args.directory)
    except (OSError, ValueError) as error:
        raise UsageError(f"cannot read {args.directory / 'captures.json'}: {error}") from error
    if not entries:
        print(f"minify-client: no captures in {args.directory}", file=sys.stderr)
        return EXIT_OK
    codes = []
    with _client(args) as client:
        try:  # an older server lists every bug (each open) or none: the note is only a courtesy
            fixed = [bug for bug in client.bugs(limit=500, status="fixed").bugs if bug.status == "fixed"]
        except MinifyError:
            fixed = []
        for entry in entries:
            spec = JobSpec.model_validate_json((args.directory / entry["spec"]).read_text())
            created = client.submit(args.directory / entry["program"], spec, inputs=args.directory / entry["inputs"])
            dashboard = client.dashboard_url(created)
            try:
                record_job(args.directory, entry["name"], created.id, dashboard)
            except (OSError, ValueError) as error:
                print(f"minify-client: warning: job {created.id} not recorded in captures.json: {error}",
                      file=sys.stderr)
            print(f"{entry['name']}: job {created.id} ({len(entry['tests'])} tests) {dashboard}")
            if known := _known_fixed(client, spec.failure.signature, fixed):
                print(f"{entry['name']}: {known}")
            if args.wait:
                codes.append(_follow(client, created.id, args, (args.out or Path("minify-repros")) / entry["name"]))
    return EXIT_FAILED if EXIT_FAILED in codes else max(codes, default=EXIT_OK)


def _check_program_json(program: Path, inputs: Path | None) -> None:
    """Say before uploading what the server would refuse: a program.json that is not one, or one
    without its inputs file (its values)."""
    try:
        read_document(program.read_bytes())
    except ProgramJsonError as error:
        raise UsageError(f"{program.name}: {error}") from None
    if inputs is None:
        raise UsageError(f"{program.name} is a program.json: it needs its inputs file (--inputs, the capture's "
                         "inputs.pt: every placeholder's value by name)")


def _warn_if_it_runs_code(program: Path) -> None:
    """Say before uploading what the server will say: members of the .pt2 that would run code when
    loaded (pickles) are refused unless the server's operator allows pickles."""
    try:
        unsafe = find_unsafe_members(program)
    except (zipfile.BadZipFile, OSError):
        return  # not a zip: the server says what is wrong with it
    if unsafe:
        print(f"minify-client: warning: {program.name}: {describe_unsafe_members(unsafe)}; a server refuses it "
              "unless its operator allows pickles (MINIFY_ALLOW_PICKLE=1)", file=sys.stderr)


def _watch(args: argparse.Namespace) -> int:
    with _client(args) as client:
        try:
            status = client.status(args.job_id)
            _progress_stream(args).write(f"job {status.id}: {status.status.value} ({client.dashboard_url(status)})\n")
            return _follow(client, args.job_id, args, args.out)
        except KeyboardInterrupt:
            return _interrupted(args.job_id, args, args.out)


def _status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        status = client.status(args.job_id)
        if args.json:
            _print_json({**status.model_dump(mode="json"), "dashboard": client.dashboard_url(status)})
            return EXIT_OK
        progress = status.progress
        result = status.result
        rows = [
            ("job", status.id),
            ("status", status.status.value),
            ("reason", _reason(status)),
            ("signature", result.signature if result is not None and status.status is JobState.succeeded else None),
            ("note", _spec_mistake_note(status)),
            ("program", status.program_name),
            ("backend", f"{status.spec.backend} on {status.spec.device}"),
            ("phase", None if status.status.finished else progress.phase or None),
            ("nodes", _nodes(progress.nodes_original, progress.nodes_current)),
            ("checks", f"{progress.checks_total} ({progress.checks_cached} cached)"
             if progress.checks_total else None),
            ("elapsed", f"{progress.elapsed_s:.1f}s" if progress.elapsed_s else None),
            ("original", (original_summary(status.result) or "").removeprefix("original: ") if status.result else None),
            ("next", status.result.next_step if status.result else None),
            ("culprit", _culprit_row(status)),
            ("versions", (_versions_line(status.result) or "").removeprefix("versions: ") if status.result else None),
            *[("warning", warning) for warning in status.warnings],
            ("dashboard", client.dashboard_url(status)),
        ]
        for label, value in rows:
            if value:
                print(f"{label + ':':<11}{value}")
        for line in original_output_lines(result) if result is not None else []:
            print(line)
    return EXIT_OK


def _versions_line(report: Report) -> str | None:
    """The version phase's line, where a second torch was tried (with one there is no range to tell)."""
    if report.versions_state is not CulpritState.running and not report.versions_compared:
        return None
    return versions_summary(report)


def _reason(status: JobStatus) -> str | None:
    """Why a job did not succeed: its own reason, or its report's."""
    if status.status is JobState.succeeded:
        return None
    return status.reason or (status.result.reason if status.result is not None else None)


def _spec_mistake_note(status: JobStatus) -> str | None:
    """For a job whose failure is torch refusing the job's own setting: the user's mistake, not a bug."""
    result = status.result
    key = config_mistake(result.signature, status.spec.config) if result is not None else None
    if key is None:
        return None
    return (f"torch refused the spec's own setting {key}={status.spec.config[key]!r}: a mistake in the spec, "
            "not a compiler bug (not filed); fix the value and submit again")


def _culprit_row(status: JobStatus) -> str | None:
    """`running (after the result)`, or the culprit's summary once the phase ended."""
    if status.culprit_state is CulpritState.running:
        return "running (the culprit phase follows the delivered result)"
    found = culprit_summary(status.result) if status.result is not None and status.culprit_state else None
    return found.removeprefix("culprit: ") if found else None


def _download(args: argparse.Namespace) -> int:
    out_dir: Path = args.out or Path(f"minify-{args.job_id}")
    with _client(args) as client:
        paths = client.download(args.job_id, out_dir, args.name)
    if not paths:
        return _fail(f"job {args.job_id} has no artifacts", EXIT_FAILED)
    if args.json:
        _print_json({"id": args.job_id, "artifacts": {name: str(path) for name, path in paths.items()}})
    else:
        for path in paths.values():
            print(path)
    return EXIT_OK


BISECT_POLL_S = 1.0


def _bisect(args: argparse.Namespace) -> int:
    with _client(args) as client:
        bisection = client.bisect(args.job_id, args.good, args.bad)
        shown = 0
        while args.wait and bisection.state == "running":
            time.sleep(BISECT_POLL_S)
            result = client.status(args.job_id).result
            bisection = result.bisect if result is not None and result.bisect is not None else bisection
            if not args.json:
                for run in bisection.steps[shown:]:
                    detail = run.signature if run.outcome.value == "different" else run.reason or ""
                    print(f"  torch {run.torch}: {run.outcome.value}" + (f" ({detail})" if detail else ""),
                          flush=True)
            shown = len(bisection.steps)
    if args.json:
        _print_json(bisection.model_dump(mode="json"))
        return EXIT_OK
    print(bisect_summary(bisection))
    return EXIT_FAILED if bisection.state == "failed" else EXIT_OK


def _cancel(args: argparse.Namespace) -> int:
    with _client(args) as client:
        status = client.cancel(args.job_id)
    if args.json:
        _print_json(status.model_dump(mode="json"))
    elif status.status.finished and status.culprit_state is CulpritState.running:
        print(f"job {status.id}: stopping its culprit phase (the job stays {status.status.value})")
    elif status.status.finished:
        print(f"job {status.id}: {status.status.value}")
    else:
        print(f"job {status.id}: cancelling (it was {status.status.value}; it stops within seconds, "
              f"`minify-client status {status.id}` shows it cancelled)")
    return EXIT_OK


def _list(args: argparse.Namespace) -> int:
    with _client(args) as client:
        jobs = client.list(args.status, limit=args.limit)
    if args.json:
        _print_json(jobs.model_dump(mode="json"))
        return EXIT_OK
    rows = [
        (
            job.id,
            job.status.value,
            job.program_name or "",
            _nodes(job.progress.nodes_original, job.progress.nodes_current) or "",
            str(job.progress.checks_total),
            job.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            _outcome(job),
        )
        for job in jobs.jobs
    ]
    header = ("ID", "STATUS", "PROGRAM", "NODES", "CHECKS", "CREATED", "SIGNATURE OR REASON")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]).rstrip())
    if jobs.total > len(jobs.jobs):
        print(f"({len(jobs.jobs)} of {jobs.total} jobs)")
    return EXIT_OK


LIST_OUTCOME_CHARS = 100


def _outcome(job: JobStatus) -> str:
    """What a listed job found (its signature) or why it did not (its reason), on one line."""
    text = (job.result.signature if job.status is JobState.succeeded and job.result is not None else None) or \
        _reason(job) or ""
    line = " ".join(text.split())
    return line if len(line) <= LIST_OUTCOME_CHARS else line[:LIST_OUTCOME_CHARS - 1] + "…"


def _bugs(args: argparse.Namespace) -> int:
    words = list(args.words)
    action = words.pop(0) if words and words[0] in ("close", "reopen") else None
    if len(words) > 1 or (action and not words):
        raise UsageError("usage: minify-client bugs [ID | close ID --reason WHY | reopen ID --reason WHY]")
    if action and not (args.reason or "").strip():
        raise UsageError(f"bugs {action} needs --reason: why it is {action}ed")
    if not action and args.reason:
        raise UsageError("--reason is for `bugs close ID` and `bugs reopen ID`")
    bug_id = words[0] if words else None
    if action:
        return _change_bug(args, action, bug_id or "")
    with _client(args) as client:
        if bug_id:
            bug = client.bug(bug_id)
            if args.json:
                _print_json(bug.model_dump(mode="json"))
                return EXIT_OK
            rows = [("bug", bug.id), ("signature", bug.signature), ("kind", bug.failure_kind),
                    ("backend", f"{bug.backend} on {bug.device}"), ("jobs", str(bug.count)),
                    ("status", _bug_status(bug)), ("affected", ", ".join(bug.affected)),
                    *[("history", _change_line(change)) for change in bug.history],
                    ("tried", ", ".join(f"{version} {outcome}" for version, outcome in bug.versions_tried.items())),
                    ("first seen", f"{bug.first_seen:%Y-%m-%d %H:%M:%S}"),
                    ("last seen", f"{bug.last_seen:%Y-%m-%d %H:%M:%S}"),
                    ("repro", f"{client.server}{bug.repro}" if bug.repro else None),
                    ("job ids", " ".join(bug.job_ids))]
            for label, value in rows:
                if value:
                    print(f"{label + ':':<12}{value}")
            return EXIT_OK
        bugs = client.bugs(limit=args.limit, status=args.status)
    if args.json:
        _print_json(bugs.model_dump(mode="json"))
        return EXIT_OK
    rows = [(bug.id, str(bug.count), f"{bug.last_seen:%Y-%m-%d %H:%M:%S}", bug.representative,
             _bug_status_cell(bug), bug.signature) for bug in bugs.bugs]
    header = ("BUG", "JOBS", "LAST SEEN", "REPRESENTATIVE", "STATUS", "SIGNATURE")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]).rstrip())
    if bugs.total > len(bugs.bugs):
        print(f"({len(bugs.bugs)} of {bugs.total} bugs)")
    return EXIT_OK


def _change_line(change: BugChange) -> str:
    """`2026-12-01 10:02 closed (won't fix) by alice: why`, one line of a bug's history."""
    what = f"closed ({RESOLUTION_WORDS.get(change.resolution or 'fixed')})" if change.action == "closed" \
        else change.action
    by = f" by {change.by}" if change.by else ""
    return f"{change.at:%Y-%m-%d %H:%M} {what}{by}: {change.reason}"


def _change_bug(args: argparse.Namespace, action: str, bug_id: str) -> int:
    """`bugs close ID` / `bugs reopen ID`: who is --by or the OS user (a server with tokens records
    the token's name instead)."""
    by = args.by or _os_user()
    with _client(args) as client:
        if action == "close":
            bug = client.close_bug(bug_id, args.reason, args.resolution, by)
        else:
            bug = client.reopen_bug(bug_id, args.reason, by)
    if args.json:
        _print_json(bug.model_dump(mode="json"))
        return EXIT_OK
    print(f"bug {bug.id}: {_bug_status(bug)}")
    if bug.status == "closed" and bug.closure is not None:
        print("a job that finds it again reopens it (regressed)" if bug.closure.resolution == "fixed" else
              "it stays closed; jobs that find it again are counted")
    return EXIT_OK


def _os_user() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        return None


def _logs(args: argparse.Namespace) -> int:
    if not 1 <= args.tail <= 5000:
        raise UsageError("--tail must be between 1 and 5000")
    with _client(args) as client:
        job_log = client.log(args.job_id, args.tail)
    if args.json:
        _print_json(job_log.model_dump(mode="json"))
        return EXIT_OK
    if job_log.more:
        print(f"minify-client: older lines left out; --tail {min(5000, args.tail * 4)} shows more", file=sys.stderr)
    if not job_log.lines:
        print(f"minify-client: job {args.job_id} has no log yet (no worker has run it)", file=sys.stderr)
    for line in job_log.lines:
        print(line)
    return EXIT_OK


# ---- following a job --------------------------------------------------------------------------


def _follow(client: Client, job_id: str, args: argparse.Namespace, out_dir: Path | None) -> int:
    """Show progress until the job ends, download its artifacts into `out_dir`, print the result;
    then, unless --no-wait-culprit, a live line while the culprit phase runs (it follows the
    delivered result), its summary line when it ends, and report.json and repro.py downloaded
    again. A Ctrl-C before the result reaches the caller as KeyboardInterrupt, the progress view
    closed; one while only the culprit is pending ends the wait with exit 0 (the repro is saved)."""
    view = progress_view(_progress_stream(args))
    wait_culprit = getattr(args, "wait_culprit", True)
    events = client.events(job_id, culprit=wait_culprit)
    try:
        view.start()
        for event in events:
            view.update(event)
            if event.type == "status" and event.status is not None and event.status.finished:
                break
    finally:
        view.close()
    status = client.status(job_id)
    artifacts: dict[str, Path] = {}
    if out_dir is not None and status.status != JobState.cancelled:
        artifacts = client.download(job_id, out_dir)
    report = _read_report(artifacts) or status.result
    exit_code = EXIT_CODES.get(status.status, EXIT_FAILED)
    pending = wait_culprit and status.status is JobState.succeeded and status.culprit_state is CulpritState.running
    if not args.json:
        _print_result(status, report, artifacts, out_dir)
    if pending:
        report = _wait_for_culprit(client, job_id, events, args, out_dir, artifacts) or report
    if args.json:
        _print_json({
            "id": job_id,
            "status": status.status.value,
            "reason": status.reason,
            "exit_code": exit_code,
            "dashboard": client.dashboard_url(status),
            "artifacts": {name: str(path) for name, path in artifacts.items()},
            "report": report.model_dump(mode="json") if report is not None else None,
        })
    return exit_code


def _wait_for_culprit(client: Client, job_id: str, events: Iterator[ProgressEvent], args: argparse.Namespace,
                      out_dir: Path | None, artifacts: dict[str, Path]) -> Report | None:
    """The rest of a succeeded job's events, while its culprit phase runs: one live line (the
    phase's last step), then the culprit's summary line, report.json and repro.py refreshed in
    `out_dir`. The final report, or None when Ctrl-C stopped the wait."""
    line = _LiveLine(_progress_stream(args))
    try:
        # The phase's first message, so that it is not shown again when it arrives: in a log (no
        # terminal) a guess at a later step printed that step before this one, and a bisection
        # where none runs (a custom backend's phase has no stages).
        line.show(f"culprit: {CULPRIT_STARTED}…", hint=" (Ctrl-C stops waiting; the repro is saved)")
        for event in events:
            if event.type == "progress" and event.message:
                line.show(f"culprit: {event.message.removeprefix('culprit: ')}…")
    except KeyboardInterrupt:
        line.end()
        where = f"{out_dir / 'report.json'} after `minify-client download {job_id}`" if out_dir else \
            f"`minify-client status {job_id}`"
        print(f"stopped waiting for the culprit; the repro is saved. The culprit will show in {where} "
              f"and on {client.dashboard_url(job_id)}", file=sys.stderr)
        return None
    line.end()
    status = client.status(job_id)
    report = status.result
    if out_dir is not None and status.status is JobState.succeeded:
        names = [name for name in ("report.json", "repro.py") if name in artifacts]
        artifacts.update(client.download(job_id, out_dir, names))
        report = _read_report(artifacts) or report
    if not args.json and report is not None:
        if found := _versions_line(report):
            print(found)
        print(culprit_summary(report) or f"culprit: {report.culprit_state.value if report.culprit_state else '?'}")
        if out_dir is not None and artifacts:
            print(f"report.json and repro.py in {out_dir} now carry the culprit")
    return report


class _LiveLine:
    """One line rewritten in place at a terminal; at most one line per new text elsewhere (logs)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.text = ""

    def show(self, text: str, hint: str = "") -> None:
        """Show `text` (and `hint` after it) unless `text` is what is shown already."""
        if text == self.text:
            return
        self.text = text
        if self.tty:
            self.stream.write(f"\r\x1b[2K{text}{hint}")
        else:
            self.stream.write(f"{text}{hint}\n")
        self.stream.flush()

    def end(self) -> None:
        if self.tty and self.text:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()


def _print_result(status: JobStatus, report: Report | None, artifacts: dict[str, Path],
                  out_dir: Path | None) -> None:
    print(summary(status.model_copy(update={"result": report})))
    if status.status == JobState.succeeded and report is not None and (inputs := shrunk_inputs(report)):
        print(inputs)
    if status.status == JobState.succeeded and report is not None and (found := culprit_summary(report)):
        print(found)
    if status.status == JobState.succeeded and report is not None and (found := _versions_line(report)):
        print(found)
    if status.status is JobState.not_reproducible and report is not None:
        for line in not_reproduced_lines(report):
            print(line)
    if status.status == JobState.succeeded and report is not None and report.graph_code:
        print("\nminimized graph:")
        print(report.graph_code.rstrip())
    if artifacts:
        print(f"\nartifacts in {out_dir}: {', '.join(artifacts)}")
    if "repro.py" in artifacts:
        print(f"reproduce with: python {artifacts['repro.py']}")
    sys.stdout.flush()


def _read_report(artifacts: dict[str, Path]) -> Report | None:
    path = artifacts.get("report.json")
    if path is None:
        return None
    try:
        return Report.model_validate_json(path.read_bytes())
    except ValueError:
        return None


def _interrupted(job_id: str, args: argparse.Namespace, out_dir: Path | None) -> int:
    print(f"\ninterrupted: job {job_id} keeps running on the server; resume with: "
          f"{_resume_command(job_id, args, out_dir)}", file=sys.stderr)
    return EXIT_INTERRUPTED


def _resume_command(job_id: str, args: argparse.Namespace, out_dir: Path | None) -> str:
    parts = ["minify-client", "watch", job_id]
    if args.server:
        parts += ["--server", args.server]
    if out_dir is not None:
        parts += ["--out", str(out_dir)]
    return " ".join(parts)


# ---- helpers ----------------------------------------------------------------------------------


def _client(args: argparse.Namespace) -> Client:
    retry_for_s: float | None = args.retry_for
    if retry_for_s is None:
        try:
            retry_for_s = retry_for_from_environment()
        except ValueError as error:
            raise UsageError(str(error)) from error
    return Client(args.server, args.token, retry_for_s=retry_for_s, on_retry=_say_retrying)


def _retry_for(raw: str) -> float:
    try:
        return parse_retry_for(raw)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def _say_retrying(message: str) -> None:
    print(f"minify-client: {message}", file=sys.stderr, flush=True)


def _progress_stream(args: argparse.Namespace) -> TextIO:
    """Progress goes to stdout, or to stderr when stdout carries JSON."""
    return sys.stderr if args.json else sys.stdout


def _nodes(original: int | None, current: int | None) -> str | None:
    if original is not None and current is not None:
        return f"{original} → {current}"
    return str(current) if current is not None else None


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


def _fail(message: str, code: int) -> int:
    print(f"minify-client: error: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
