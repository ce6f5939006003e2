"""The spec flags shared by `minify-worker minify` and `minify-client submit` (README.md, "Minify a program")."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pydantic import ValidationError

from minify_contract.models import BUILTIN_BACKENDS, DYNAMIC_MODES, FAILURE_KINDS, JobSpec, parse_config_value


class SpecError(ValueError):
    """The flags or the spec file do not make a valid JobSpec."""


def add_spec_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("job spec")
    group.add_argument("--spec", type=Path, help="a JSON job spec; the flags below override its fields")
    group.add_argument("--backend", help=f"{' | '.join(BUILTIN_BACKENDS)} | a registered torch.compile backend's "
                                         "name (tensorrt, openxla, ...) | pkg.module:callable")
    group.add_argument("--device", help="cpu | cuda | cuda:N")
    group.add_argument("--failure", choices=FAILURE_KINDS, help="the kind of failure to preserve")
    group.add_argument("--match", help='regex over "ExceptionType: message" a candidate must fail with')
    group.add_argument("--signature", metavar="TEXT",
                       help='the failure\'s known root-cause signature, as report.json writes it ("ExceptionType: '
                            'message"): candidates are judged against it from the first check, and an original '
                            "that fails otherwise ends the job not_reproducible")
    group.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                       help="torch._inductor.config override, repeatable")
    group.add_argument("--op-module", dest="op_modules", action="append", default=[], metavar="MODULE",
                       help="a Python module that registers the program's custom ops (torch.library), imported by "
                            "the worker before it loads the program where its operator allows it "
                            "(MINIFY_ALLOWED_OP_MODULES); repeatable, added to the spec file's")
    group.add_argument("--strict-accuracy", action="store_true", default=None,
                       help="compare boolean and integer outputs too (torch's --strict-accuracy)")
    group.add_argument("--tolerance", type=float, help="accuracy tolerance (default 1e-3)")
    group.add_argument("--candidate-timeout", type=float, metavar="SECONDS",
                       help="upper bound on one candidate's run (default: calibrated from the original)")
    group.add_argument("--original-timeout", type=float, metavar="SECONDS",
                       help="upper bound on one run of the original (default: 10 minutes)")
    group.add_argument("--memory-limit", type=int, metavar="MIB",
                       help="memory bound of one candidate (default: the machine's memory over the parallelism)")
    group.add_argument("--job-timeout", type=float, metavar="SECONDS",
                       help="the whole job's limit: a job still running then ends failed, 'job timed out' "
                       "(default 3600, at most 604800, a week)")
    group.add_argument("--parallelism", type=int, help="candidates in flight at once")
    group.add_argument("--dynamic", choices=DYNAMIC_MODES,
                       help="dims the program marks dynamic: as_exported (default: symbolic, with their "
                            "ranges) | auto (torch.compile's automatic dynamic) | static")
    group.add_argument("--no-culprit", dest="culprit", action="store_false", default=None,
                       help="skip the culprit phase (default: once minimal, find the compiler stage to blame and "
                            "the settings that avoid the bug)")
    group.add_argument("--no-versions", dest="versions", action="store_false", default=None,
                       help="skip the version phase (default: after the result, run repro.py under every other "
                            "torch version the workers offer: which fail the same way, the regression range)")
    group.add_argument("--no-shrink", dest="shrink", action="store_false", default=None,
                       help="keep the minimized program's input sizes (default: halve its tensor inputs' dims "
                            "while the failure holds)")


def spec_from_args(args: argparse.Namespace) -> JobSpec:
    """Build the JobSpec from `--spec FILE` and the flags; raises SpecError with a readable reason."""
    data: dict = {}
    if args.spec is not None:
        try:
            data = json.loads(Path(args.spec).read_text())
        except (OSError, ValueError) as error:
            raise SpecError(f"cannot read spec file {args.spec}: {error}") from error
        if not isinstance(data, dict):
            raise SpecError(f"spec file {args.spec} must hold a JSON object")
    for field in ("backend", "device", "dynamic", "shrink", "culprit", "versions"):
        if getattr(args, field) is not None:
            data[field] = getattr(args, field)
    failure = dict(data.get("failure") or {})
    if args.failure is not None:
        failure["kind"] = args.failure
    if args.match is not None:
        failure["match"] = args.match
    if args.strict_accuracy:
        failure["strict_accuracy"] = True
    if args.tolerance is not None:
        failure["tolerance"] = args.tolerance
    if args.signature is not None:
        failure["signature"] = args.signature
    data["failure"] = failure
    config = dict(data.get("config") or {})
    for item in args.config:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SpecError(f"--config expects KEY=VALUE, got {item!r}")
        config[key.strip()] = parse_config_value(value)
    data["config"] = config
    if args.op_modules:
        data["op_modules"] = [*(data.get("op_modules") or []), *args.op_modules]
    limits = dict(data.get("limits") or {})
    if args.candidate_timeout is not None:
        limits["candidate_timeout_s"] = args.candidate_timeout
    if args.original_timeout is not None:
        limits["original_timeout_s"] = args.original_timeout
    if args.memory_limit is not None:
        limits["memory_mb"] = args.memory_limit
    if args.job_timeout is not None:
        limits["job_timeout_s"] = args.job_timeout
    if args.parallelism is not None:
        limits["parallelism"] = args.parallelism
    data["limits"] = limits
    try:
        return JobSpec.model_validate(data)
    except ValidationError as error:
        raise SpecError(describe_validation_error(error)) from error


def describe_validation_error(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "spec"
        parts.append(f"{where}: {item['msg']}")
    return "invalid spec: " + "; ".join(parts)
