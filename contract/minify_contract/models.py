"""Wire models shared by the client, the server and the worker.

This module is the contract of docs/architecture.md ("Contracts") in code. It imports no torch: the
client installs without it, and the server must never import it.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from minify_contract import signatures

BUILTIN_BACKENDS = ("inductor", "aot_inductor", "aot_eager", "eager")
FAILURE_KINDS = ("compile_error", "runtime_error", "crash", "accuracy", "timeout", "oom", "any")
DYNAMIC_MODES = ("as_exported", "auto", "static")
# What the uploaded program is: a torch.export archive, minify's program.json (an FX program
# torch.export.save cannot write: minify_contract.program_json), a StableHLO module (MLIR text or
# bytecode, or a portable VHLO artifact) or HLO text as XLA dumps it (docs/hlo.md).
PROGRAM_FORMATS = ("pt2", "fx_json", "stablehlo", "hlo")
# A StableHLO job's minimal module, its HLO text and inputs stand where a .pt2 job's .pt2 and inputs.pt do.
# A program torch.export.save cannot write is delivered as minimized.json (program.json's format).
ARTIFACT_NAMES = ("minimized.pt2", "minimized.json", "repro.py", "inputs.pt", "signature_rules.py", "minimized.mlir",
                  "minimized.hlo", "inputs.npz", "report.json", "bundle.tar.gz")
# A job's own log, in its folder beside the artifacts' (never an artifact): the work horse's log
# records while it ran the job, every attempt (minify_worker/service/joblog.py writes it, the server reads
# it for GET /v1/jobs/{id}/log); one older file (".1") is kept when it rotates.
JOB_LOG_NAME = "worker.log"

_CUSTOM_BACKEND = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
# A name torch.compile backends are registered under (`torch._dynamo.list_backends()`): "tensorrt",
# "openxla". Which names exist depends on what the worker has installed: only the shape is checked here.
_REGISTERED_BACKEND = re.compile(r"^[A-Za-z_]\w*$")
_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
# The longest a job or one candidate may be given: a week. Far larger values overflow the timers
# they become (RQ's alarm, thread waits) and every attempt dies, so they are refused up front.
MAX_TIMEOUT_S = 7 * 24 * 3600
# The most candidate children of one job at once (`limits.parallelism`, `MINIFY_PARALLELISM`).
MAX_PARALLELISM = 256


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FailureSpec(_Strict):
    """What "still fails" means for this job."""

    kind: Literal["compile_error", "runtime_error", "crash", "accuracy", "timeout", "oom", "any"] = "any"
    match: str | None = Field(
        default=None,
        description='Regex searched in "ExceptionType: message"; default: the signature of the original.',
    )
    strict_accuracy: bool = False
    tolerance: float = Field(default=1e-3, gt=0)
    signature: str | None = Field(
        default=None,
        description="the root-cause signature the failure is known to have (as report.json's `signature` "
                    "writes it), e.g. from a capture: candidates are judged against it from the first check, "
                    "and an original that fails differently ends the job not_reproducible",
    )

    training: bool = Field(
        default=False,
        description="compile the program for training, as the training step whose compile failed did: grad "
                    "mode on and every floating-point input requiring grad, so AOT autograd traces the joint "
                    "forward-and-backward graph and partitions it (a capture sets it for a compile that failed "
                    "there); by default the program is compiled for inference",
    )

    @field_validator("signature")
    @classmethod
    def _signature_shape(cls, value: str | None) -> str | None:
        if value is not None and signatures.parse_signature(value) is None:
            raise ValueError(f"failure.signature {value!r} must start with an exception type or a signal name, "
                             "as report.json's signature writes it: 'ExceptionType: message' or 'SIGSEGV'")
        return value

    @field_validator("match")
    @classmethod
    def _match_compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as error:
                raise ValueError(f"failure.match is not a valid regex: {error}") from error
        return value


class Limits(_Strict):
    candidate_timeout_s: float | None = Field(default=None, gt=0, le=MAX_TIMEOUT_S)
    original_timeout_s: float | None = Field(
        default=None, gt=0, le=MAX_TIMEOUT_S,
        description="how long one run of the original may take (default: the worker's, minutes, not the job's hour)",
    )
    memory_mb: int | None = Field(
        default=None, ge=64, le=1 << 24,
        description="memory bound of one candidate's process group; default: the machine's memory / parallelism",
    )
    job_timeout_s: float = Field(default=3600, gt=0, le=MAX_TIMEOUT_S)
    parallelism: int | None = Field(default=None, ge=1, le=MAX_PARALLELISM)


class BisectRequest(_Strict):
    """Narrow a regression between two torch versions by installing the releases in between."""

    good: str = Field(description="a torch version the repro passes on, e.g. 2.11.0")
    bad: str = Field(description="a newer one it fails on the same way, e.g. 2.15.0")


class Autocast(_Strict):
    """The autocast region the compiled function ran in (`torch.autocast(device, dtype=dtype)`)."""

    device: Literal["cpu", "cuda"]
    dtype: Literal["float16", "bfloat16"]


class JobSpec(_Strict):
    """The job spec every side shares (README.md's spec flags; docs/architecture.md, "Contracts")."""

    backend: str = "inductor"
    device: str = "cpu"
    failure: FailureSpec = Field(default_factory=FailureSpec)
    config: dict[str, Any] = Field(
        default_factory=dict, description="torch._inductor.config overrides, applied in each child"
    )
    limits: Limits = Field(default_factory=Limits)
    dynamic: Literal["as_exported", "auto", "static"] = Field(
        default="as_exported",
        description="how the dims the program marks dynamic are compiled: as_exported (symbolic, with the "
                    "program's ranges), auto (as torch.compile's automatic dynamic treats a dim it saw change: "
                    "symbolic unless the graph specializes it), static (every size concrete)",
    )
    shrink: bool = Field(
        default=True,
        description="once the graph is minimal, halve its tensor inputs' dims while the failure holds (static "
                    "shapes only; the shrink phase)",
    )
    culprit: bool = Field(
        default=True,
        description="once the graph is minimal, find the compiler stage to blame (compiler bisection) and the "
                    "settings that avoid the bug on the original (the culprit phase)",
    )
    program_format: Literal["pt2", "fx_json", "stablehlo", "hlo"] = Field(
        default="pt2",
        description="what the program is: a torch.export archive (pt2), minify's program.json for a program "
                    "torch.export.save cannot write (fx_json: the FX graph as JSON, its values in the inputs "
                    "file by placeholder name; docs/client.md), a StableHLO module (stablehlo: MLIR text "
                    "or bytecode, or a VHLO artifact) or HLO text as XLA dumps it (hlo); the last two run with "
                    "backend xla or command (docs/hlo.md)",
    )
    bisect: BisectRequest | None = Field(
        default=None,
        description="after the version phase, install the torch releases between good and bad from the worker's "
                    "index (MINIFY_TORCH_INDEX) and narrow to the first bad one (report.json's bisect)",
    )
    op_modules: list[str] = Field(
        default_factory=list,
        description="Python modules that register the program's custom ops (torch.library: torch.ops.<ns>.<op> "
                    "outside torch's own namespaces), imported by the worker before it loads the program, where "
                    "its operator allows them (MINIFY_ALLOWED_OP_MODULES, module prefixes); a capture records them",
    )
    autocast: Autocast | None = Field(
        default=None,
        description="the program's forward runs inside torch.autocast(device, dtype=dtype), compiled and eager, as "
                    "the user's program called the compiled function inside an autocast region (a capture records "
                    "it); gradients are taken after the region, as a training step takes them. Default: no autocast",
    )
    versions: bool = Field(
        default=True,
        description="once the result is delivered, run repro.py under every other torch version the workers offer "
                    "and say which fail the same way (the version phase: report.json's versions, regression_range, "
                    "fixed_in)",
    )

    @field_validator("backend")
    @classmethod
    def _backend_known(cls, value: str) -> str:
        if value in BUILTIN_BACKENDS or _CUSTOM_BACKEND.match(value) or _REGISTERED_BACKEND.match(value):
            return value
        raise ValueError(
            f"backend {value!r} is neither one of {', '.join(BUILTIN_BACKENDS)}, nor the name of a registered "
            "torch.compile backend (an identifier, as torch._dynamo.list_backends() lists them), nor a "
            "'pkg.module:callable' torch.compile backend"
        )

    @field_validator("device")
    @classmethod
    def _device_known(cls, value: str) -> str:
        if not _DEVICE.match(value):
            raise ValueError(f"device {value!r} must be cpu, cuda or cuda:N")
        return value

    @field_validator("config")
    @classmethod
    def _config_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if not re.match(r"^[A-Za-z_][\w.]*$", key):
                raise ValueError(f"config key {key!r} is not a dotted torch._inductor.config name")
        return value

    @field_validator("op_modules")
    @classmethod
    def _op_modules_named(cls, value: list[str]) -> list[str]:
        for module in value:
            if not _MODULE.match(module):
                raise ValueError(f"op module {module!r} is not a dotted Python module name")
        return list(dict.fromkeys(value))

    @property
    def device_class(self) -> Literal["cpu", "cuda"]:
        """The queue this job goes to."""
        return "cuda" if self.device.startswith("cuda") else "cpu"


class JobState(str, Enum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    not_reproducible = "not_reproducible"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def finished(self) -> bool:
        return self not in (JobState.queued, JobState.running)


class CulpritState(str, Enum):
    """Where a job's culprit phase stands. It runs after the result is delivered (the job is
    `succeeded` with its artifacts while it is `running`); report.json, repro.py's header and the
    job record are rewritten when it ends, and a `culprit` event says so."""

    running = "running"
    done = "done"
    skipped = "skipped"  # not asked for (spec culprit: false), or the job did not succeed
    cancelled = "cancelled"  # a cancel (or the job's timeout) stopped it; the job stays succeeded
    lost = "lost"  # its worker died or shut down during the phase; the job stays succeeded


class OriginalState(str, Enum):
    """Where the original program's verdict stands. A job whose failure is known in advance (the
    spec gives its signature, or the kind leaves no doubt) delivers its result as soon as its
    minimal program fails so, while the original still runs (`running`); the verdict follows:
    `confirmed` (it failed the same way) or `not_reproduced` (it did not: `original_verdict` says
    what it did, and the job keeps its result). A job that waited for the verdict has it at once."""

    running = "running"
    confirmed = "confirmed"
    not_reproduced = "not_reproduced"
    stopped = "stopped"  # a cancel or the job's timeout ended the original's run before its verdict
    lost = "lost"  # the worker died or shut down before the verdict


class Progress(BaseModel):
    """Where a minification stands: what `GET /v1/jobs/{id}` shows."""

    phase: str = ""
    nodes_original: int | None = None
    nodes_current: int | None = None
    checks_total: int = 0
    checks_cached: int = 0
    checks_in_flight: int = 0
    outcomes: dict[str, int] = Field(
        default_factory=dict, description="candidate outcomes by kind: passes, fails, crashed, ..."
    )
    elapsed_s: float = 0.0
    signature: str | None = Field(default=None, description="the failure signature being preserved")


class Milestone(str, Enum):
    """What step of a job an event marks (`ProgressEvent.milestone`): a program reads the type, a
    person the event's message. Periodic progress events mark none."""

    preparing = "preparing"
    original_started = "original_started"  # the original runs; candidates are judged meanwhile
    reproduced = "reproduced"  # the original failed the wanted way: the target is known
    flaky = "flaky"  # ... in some of its runs only
    restarted = "restarted"  # candidates were judged against a guess that did not hold
    accepted = "accepted"  # a smaller failing program
    hang_guessed = "hang_guessed"  # the original runs so long that it is taken for a hang, for now
    hang_confirming = "hang_confirming"  # the result runs with a longer timeout to confirm the hang
    hang_confirmed = "hang_confirmed"
    hang_refuted = "hang_refuted"
    shrink_started = "shrink_started"
    shrink_skipped = "shrink_skipped"
    shrunk = "shrunk"  # the shrink phase ended (its message says whether any input shrank)
    writing_artifacts = "writing_artifacts"
    finished = "finished"  # the job's status event
    culprit_started = "culprit_started"
    culprit_step = "culprit_step"
    culprit_ended = "culprit_ended"
    original_confirmed = "original_confirmed"  # the verdict after the delivered result: the same failure
    original_not_reproduced = "original_not_reproduced"  # ... another outcome; the result is kept


class ProgressEvent(Progress):
    """One step of a minification, as the engine reports it and the service streams it."""

    type: Literal["progress", "status", "log", "culprit", "versions"] = Field(
        "progress", description="'culprit': the culprit phase ended (after the job's final status, whose "
                                "culprit_state says 'running' when one follows); 'versions': the version phase "
                                "ended (its summary line in message), just before the culprit event")
    graph_code: str | None = Field(default=None, description="the current best graph, when it shrank")
    status: JobState | None = None
    message: str | None = None
    milestone: Milestone | None = Field(None, description="the step this event marks, if any (Milestone)")
    culprit_state: CulpritState | None = Field(
        None, description="on a succeeded status event and on culprit events: where the culprit phase stands")


class TimelinePoint(BaseModel):
    elapsed_s: float
    nodes: int
    checks: int


class InputShape(BaseModel):
    """One tensor input of the minimized program, as report.json lists it."""

    shape: list[int]
    dtype: str


class Culprit(BaseModel):
    """The compiler stage to blame, as torch's CompilerBisector finds it on the minimal graph."""

    backend: str = Field(
        description="the first backend stage that fails: aot_eager, aot_eager_decomp_partition, inductor")
    subsystem: str | None = Field(None, description="the subsystem whose disabling avoids the bug, e.g. lowerings")
    bisect_number: int | None = Field(None, description="the application of the subsystem that breaks it")
    detail: str | None = Field(None, description="what that application was, e.g. the op lowered ('relu')")
    graph: Literal["forward", "backward"] | None = Field(
        None, description="which compiled graph failed: 'forward' when the culprit is in inductor, which minify runs "
                          "under no_grad (only the forward graph is compiled); null for an earlier stage")
    probes: int = Field(0, description="probes the bisection ran, each in a sandbox child")
    notes: list[str] = Field(
        default_factory=list,
        description="probes that neither passed nor failed the same way (failed otherwise: counted as working; "
                    "hung, crashed or ran out of memory: run again, and twice stops the bisection)")


class Workaround(BaseModel):
    """A setting that avoids the bug, verified on the original program."""

    setting: str = Field(description="a spec config key (inductor's as is, torch._dynamo.config.X), or 'backend'")
    value: Any
    verified_on: str = Field(description="what was checked, e.g. 'original: compiles and runs'")


class VersionOutcome(str, Enum):
    """How repro.py ran under one torch version, held against the job's signature."""

    same = "same"  # fails with the job's signature
    different = "different"  # fails with another signature (in `signature`)
    passes = "passes"  # printed 'repro passed', exit 0
    cannot_run = "cannot_run"  # an op or API the version lacks, or no torch at all (`reason`)


class VersionRun(BaseModel):
    """One run of repro.py under one torch installation (the version phase)."""

    torch: str = Field(description="torch.__version__ of the installation, e.g. 2.14.1 or 2.15.0+cpu")
    git_version: str | None = Field(None, description="torch.version.git_version: the commit it was built from")
    outcome: VersionOutcome
    signature: str | None = Field(None, description="the failure's signature as repro.py printed it")
    reason: str | None = Field(None, description="why it could not run, or what decided the outcome")
    seconds: float = 0.0


class RegressionRange(BaseModel):
    """The bug appeared after `last_good` and by `first_bad`: (last_good, first_bad]."""

    last_good: str
    first_bad: str


class Bisection(BaseModel):
    """A bisection of torch releases: the first one whose repro fails the job's way."""

    good: str
    bad: str
    state: Literal["running", "done", "failed"] = "running"
    last_good: str | None = Field(None, description="the newest release that passes, right before first_bad")
    first_bad: str | None = Field(None, description="the oldest release that fails the same way")
    commits: str | None = Field(
        None, description="last_good's and first_bad's git versions, 'A..B': the commits that brought the bug")
    releases: list[str] = Field(default_factory=list, description="the releases from good to bad on the index")
    steps: list[VersionRun] = Field(default_factory=list, description="every run, in the order it ran")
    installs: int = Field(0, description="torch versions installed for it (the cached ones not counted)")
    reason: str | None = Field(None, description="why it stopped short of a first bad release")


class Report(BaseModel):
    """report.json: what a compiler engineer reads first."""

    status: JobState
    reason: str | None = None
    nodes_original: int | None = None
    nodes_final: int | None = None
    checks_total: int = 0
    checks_cached: int = 0
    elapsed_s: float = 0.0
    signature: str | None = None
    failure_kind: str | None = None
    signature_chain: list[str] = Field(
        default_factory=list, description="the failure's exception chain, outermost wrapper first, root cause last")
    flaky: bool = False
    original_compiles: int = Field(
        0, description="how many times the original was compiled: once, in one sandbox child, whose compiled "
                       "program then ran original_runs times")
    original_runs: int = Field(
        0, description="runs of the original's compiled program: 3, or 1 when it failed to compile")
    original_failures: int = 0
    candidate_timeout_s: float | None = None
    hang_confirm_timeout_s: float | None = Field(
        None, description="a hang judged without a user-given timeout: the minimal program still ran after this "
                          "many seconds (10x the slowest passing candidate, at least 60), which confirmed it; the "
                          "original was stopped once it ran far longer than passing candidates, before its own bound")
    backend: str
    device: str
    config: dict[str, Any] = Field(default_factory=dict)
    torch_version: str | None = None
    environment: dict[str, str] = Field(
        default_factory=dict,
        description="the worker's environment as torch.utils.collect_env reports it (Python, torch and its git "
                    "version, CUDA, cuDNN, GPU and driver, triton, the C++ compiler, the OS); 'Collection error' "
                    "says why it is partial")
    outcomes: dict[str, int] = Field(default_factory=dict)
    timeline: list[TimelinePoint] = Field(default_factory=list)
    graph_code: str | None = None
    artifacts: list[str] = Field(default_factory=list)
    artifact_errors: dict[str, str] = Field(
        default_factory=dict, description="artifacts that could not be written, and why (e.g. export refused)"
    )
    phase_s: dict[str, float] = Field(
        default_factory=dict, description="seconds spent in each phase: prepare, reproduce, reduce, shrink, artifacts"
    )
    input_shapes_original: dict[str, InputShape] = Field(
        default_factory=dict,
        description="the minimized program's tensor inputs before the shrink phase (the sizes they had in the "
                    "original program), by input name",
    )
    input_shapes_final: dict[str, InputShape] = Field(
        default_factory=dict,
        description="the same inputs after the shrink phase: the sizes minimized.pt2, repro.py and inputs.pt use",
    )
    sandbox_start: str | None = Field(
        None, description="how the fork server started: 'fork' (from a preloaded worker) or 'spawn' (a fresh Python)"
    )
    original_state: OriginalState | None = Field(
        None, description="the original program's verdict: running (the result was delivered first, its minimal "
                          "program failing with the signature the spec gives), confirmed, not_reproduced "
                          "(original_verdict says what it did; the result stands), stopped, lost; null when the "
                          "job ended before the original's verdict")
    original_verdict: str | None = Field(
        None, description="what the original did when its verdict contradicts the delivered result")
    original_output: str | None = Field(
        None, description="when the original did not fail the wanted way: what it printed in the worker (its "
                          "stdout and stderr, the last 4,000 characters) and the exception it raised, if it raised; "
                          "'' when it printed nothing and raised nothing")
    next_step: str | None = Field(
        None, description="a not reproducible job's next step to try, from what the original did (passed every "
                          "run, failed otherwise, ran past its timeout, ran out of memory)")
    culprit_state: CulpritState | None = Field(
        None, description="running (the phase runs after the result is delivered: culprit, culprit_reason and "
                          "workarounds are filled in when it ends), done, skipped, cancelled, lost; null in "
                          "reports written before the phase ran after delivery")
    culprit: Culprit | None = Field(None, description="the compiler stage to blame; null with culprit_reason")
    culprit_reason: str | None = Field(None, description="why there is no culprit (not run, not found, ...)")
    workarounds: list[Workaround] = Field(
        default_factory=list, description="settings verified to avoid the bug on the original; empty when none")
    workarounds_tried: dict[str, str] = Field(
        default_factory=dict,
        description="settings tried that are not workarounds, and what happened: 'KEY=VALUE' -> outcome on the "
                    "minimal program (or the original), or why it was not tried")
    graph_shape_hash: str | None = Field(
        None, description="structural hash of the minimal graph ignoring tensor sizes (ops, edges, dtypes, devices): "
                          "with the signature, the key of the job's bug")
    bug: str | None = Field(None, description="the id of the bug this job's minimal program belongs to")
    versions_state: CulpritState | None = Field(
        None, description="where the version phase stands (it runs after the result, before the culprit event): "
                          "running, done, skipped, cancelled, lost")
    versions: list[VersionRun] = Field(
        default_factory=list, description="repro.py under each torch version the workers offer, oldest first")
    regression_range: RegressionRange | None = Field(
        None, description="(last_good, first_bad]: null with regression_reason when no older version passes")
    regression_reason: str | None = None
    fixed_in: str | None = Field(
        None, description="the oldest version after the newest failing one that passes: the bug is fixed there")
    versions_summary: str | None = Field(
        None, description="one line: 'fails on 2.14.1, 2.15.0; passes on 2.13.0: regression in (2.13.0, 2.14.1]'")
    bisect: Bisection | None = Field(
        None, description="the bisection of torch releases asked for (spec bisect, or minify-client bisect)")

    @property
    def versions_compared(self) -> bool:
        """Whether repro.py ran under more than one torch version: with one (the workers' own) there is
        no range to tell, and the versions line is left out of repro.py, the summaries and the page."""
        return len({run.torch for run in self.versions}) > 1


class JobLinks(BaseModel):
    self: str
    events: str
    artifacts: dict[str, str] = Field(default_factory=dict)
    dashboard: str | None = None


class JobCreated(BaseModel):
    id: str
    status: JobState
    links: JobLinks
    deduplicated: bool = Field(
        False, description="true when the same program, spec and inputs were already queued, running or "
                           "minimized: this is that job")
    warnings: list[str] = Field(
        default_factory=list, description="why the job may not run soon, e.g. no worker serves its queue"
    )


class JobStatus(BaseModel):
    id: str
    status: JobState
    spec: JobSpec
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    progress: Progress = Field(default_factory=Progress)
    result: Report | None = None
    reason: str | None = None
    worker: str | None = None
    program_name: str | None = None
    attempts: int = 0
    links: JobLinks | None = None
    warnings: list[str] = Field(
        default_factory=list, description="why a queued job is not running, e.g. no worker serves its queue"
    )
    bug: str | None = Field(None, description="the bug this job belongs to, once it succeeded")
    culprit_state: CulpritState | None = Field(
        None, description="where the culprit phase stands (it runs after a succeeded job's result is delivered); "
                          "the finding is in result once it is done")


class JobLog(BaseModel):
    """A job's own log (GET /v1/jobs/{id}/log): what the worker logged while it ran the job, every
    attempt, and the last output of sandbox children that died or could not run."""

    id: str
    lines: list[str] = Field(default_factory=list, description="the last `tail` lines, oldest first")
    more: bool = Field(False, description="older lines were left out (ask with a larger tail)")
    size_bytes: int = Field(0, description="what the server holds of the log, at most 512 KiB a job")


class JobList(BaseModel):
    jobs: list[JobStatus]
    total: int
    offset: int
    limit: int


class BugFix(BaseModel):
    """What showed a bug fixed: a run of its repro that passed on a torch newer than every failing one."""

    job: str = Field(description="the job whose repro.py ran")
    torch: str = Field(description="the torch version it passed on")
    how: Literal["version phase", "re-test"] = Field(
        description="the job's own version phase, or the service's re-test of an open bug on a newly offered torch")


BugResolution = Literal["fixed", "wont_fix", "not_a_bug"]


class BugCloseRequest(_Strict):
    """Close a bug by hand (POST /v1/bugs/{id}/close)."""

    reason: str = Field(min_length=1, max_length=2000, description="why it is closed (required)")
    resolution: BugResolution = Field(
        "fixed", description="fixed: a job that finds it again reopens it (regressed); wont_fix, not_a_bug: it "
                             "stays closed, and the jobs that find it again are counted")
    by: str | None = Field(
        None, max_length=100, description="who closes it, on a server without tokens (minify-client sends --by or "
                                          "the OS user); a server with tokens records the token's name instead")


class BugReopenRequest(_Strict):
    """Reopen a closed bug by hand (POST /v1/bugs/{id}/reopen)."""

    reason: str = Field(min_length=1, max_length=2000, description="why it is reopened (required)")
    by: str | None = Field(None, max_length=100, description="who reopens it, as in BugCloseRequest")


class BugChange(BaseModel):
    """One change of a bug's state: closed or reopened by hand, or reopened by a job that found it
    again after it was closed as fixed (regressed)."""

    action: Literal["closed", "reopened", "regressed"]
    at: datetime
    by: str | None = Field(None, description="who: the token's name, or the name sent; null for regressed")
    reason: str
    resolution: BugResolution | None = Field(None, description="closed: fixed, wont_fix or not_a_bug")
    job: str | None = Field(None, description="regressed: the job that found it again")


class Bug(BaseModel):
    """The jobs whose minimal programs fail the same way: one root-cause signature, one graph shape."""

    id: str = Field(description="bug_key(signature, graph_shape_hash) (minify_contract.bugs)")
    signature: str
    graph_shape_hash: str
    failure_kind: str | None = None
    backend: str
    device: str
    count: int = Field(description="succeeded jobs filed under this bug (retention may have deleted some since)")
    job_ids: list[str] = Field(default_factory=list, description="its jobs, most recent first")
    first_seen: datetime
    last_seen: datetime
    representative: str = Field(description="the job whose repro stands for the bug (kept while the bug is listed)")
    repro: str | None = Field(None, description="link to the representative job's repro.py")
    dashboard: str | None = None
    status: Literal["open", "fixed", "closed"] = Field(
        "open", description="closed: closed by hand (closure says by whom, why and how); fixed: its repro passes on "
                            "a torch version newer than every one it fails on; else open (a bug closed as fixed "
                            "that a later job found again is open: regressed)")
    closure: BugChange | None = Field(None, description="the closing in force, while status is closed")
    jobs_since_closed: int = Field(
        0, description="jobs filed under it since it was closed (a wont_fix or not_a_bug bug stays closed)")
    history: list[BugChange] = Field(
        default_factory=list, description="every close and reopen, by hand or by a job (regressed), oldest first")
    affected: list[str] = Field(default_factory=list, description="torch versions its repro fails on, the same way")
    fixed_in: str | None = Field(None, description="the oldest version after the newest failing one that passes")
    fixed_evidence: BugFix | None = None
    versions_tried: dict[str, str] = Field(
        default_factory=dict, description="torch version -> the outcome of its repro there (the latest run)")


class BugList(BaseModel):
    bugs: list[Bug]
    total: int
    offset: int
    limit: int


class TorchInstall(BaseModel):
    """A torch installation a worker offers for the version phase's probes."""

    torch: str
    git_version: str | None = None
    origin: str | None = Field(None, description="own (the worker's), MINIFY_TORCH_ENVS, or index (installed by uv)")


class WorkerInfo(BaseModel):
    """A live worker: its RQ state and the torch versions it holds."""

    name: str
    state: str | None = None
    queues: list[str] = Field(default_factory=list)
    current_job: str | None = None
    last_heartbeat: datetime | None = None
    torch: list[TorchInstall] = Field(default_factory=list)


class WorkerList(BaseModel):
    workers: list[WorkerInfo]
    versions: dict[str, int] = Field(
        default_factory=dict, description="torch version -> how many live workers hold it")


class ErrorResponse(BaseModel):
    error: str
    detail: Any | None = None


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    redis: bool
    workers: int
    queues: dict[str, int] = Field(default_factory=dict)


_STABLEHLO_SUFFIXES = (".mlir", ".mlirbc", ".stablehlo", ".vhlo")
_HLO_SUFFIXES = (".hlo", ".hlo.txt")


def detect_program_format(name: str, head: bytes) -> str:
    """The `program_format` of a program file from its name and first bytes: a zip is a .pt2, a JSON
    object or a `.json` is minify's program.json (fx_json), MLIR bytecode (VHLO too) or a `.mlir` is
    StableHLO, text starting `HloModule` is HLO; else by suffix."""
    text = head.lstrip()
    if head.startswith(b"PK\x03\x04") or name.endswith(".pt2"):
        return "pt2"
    if text.startswith(b"{") or name.endswith(".json"):
        return "fx_json"
    if text.startswith(b"HloModule") or name.endswith(_HLO_SUFFIXES):
        return "hlo"
    if head.startswith(b"ML\xefR") or name.endswith(_STABLEHLO_SUFFIXES) or \
            text.startswith((b"module", b"func.func", b"#loc", b"//")):
        return "stablehlo"
    return "pt2"


def parse_config_value(raw: str) -> Any:
    """`--config KEY=VALUE` values: JSON when it parses (numbers, booleans, lists), else the string."""
    import json

    try:
        return json.loads(raw)
    except ValueError:
        return raw
