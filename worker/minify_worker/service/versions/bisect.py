"""Bisect torch releases: between a version a job's repro passes on and one it fails on the same
way, install the releases in between from the index and narrow to the first bad one.

`narrow` is the search (pure but for the `outcome_of` it is given): both ends checked, then the
release nearest the middle of what is left, until the last good and the first bad are neighbours.
A release that can tell nothing (fails otherwise, cannot run the repro) is skipped, as `git bisect
skip` does, and said so. Runs the caller already knows (the version phase's) cost no install, so a
bisection of N releases (both ends included) installs at most ceil(log2(N - 1)) + 2 <= log2(N) + 2.
Given a nightly index and nightly ends, it narrows to the first bad nightly; the git versions of the
last good and the first bad give the range of commits that brought the bug.

It runs for a job in two ways: asked in the spec (`JobSpec.bisect`), in the job's work horse after
the version phase; or on demand (`POST /v1/jobs/{id}/bisect`, `minify-client bisect`), as an RQ job
(`bisect_job`) on the `minify-bisect` queue, which the workers that have an index serve.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minify_contract.models import Bisection, BisectRequest, Report, VersionOutcome, VersionRun
from minify_contract.summaries import bisect_summary
from minify_worker.service.versions.envs import EnvError, IndexInstaller
from minify_worker.service.versions.probe import run_repro, stop_on_sigterm
from minify_worker.service.versions.ranges import VersionError, parse_version


@dataclass(frozen=True)
class Narrowed:
    last_good: str | None
    first_bad: str | None
    reason: str | None = None


def releases_between(available: Sequence[str], good: str, bad: str) -> list[str]:
    """`good`, the versions strictly between on the index, `bad`, oldest first. Nightlies and
    pre-releases take part only when an end is one."""
    low, high = parse_version(good), parse_version(bad)
    with_nightlies = low.is_nightly or high.is_nightly or low.pre is not None or high.pre is not None
    inside = [version for version in available
              if low < parse_version(version) < high
              and (with_nightlies or (parse_version(version).dev is None and parse_version(version).pre is None))]
    return [good, *sorted(set(inside), key=parse_version), bad]


def max_installs(releases: int) -> int:
    """The most installs `narrow` needs for `releases` versions, both ends included."""
    return 2 + (math.ceil(math.log2(releases - 1)) if releases > 2 else 0)


def narrow(releases: Sequence[str], outcome_of: Callable[[str], VersionRun]) -> Narrowed:
    """The last good and the first bad release of `releases` (oldest first: the good end, then the
    bad end last), asking `outcome_of` each one it needs."""
    good, bad = releases[0], releases[-1]
    first = outcome_of(good)
    if first.outcome is not VersionOutcome.passes:
        return Narrowed(None, None, f"the good end {good} does not pass: {_words(first)}")
    last = outcome_of(bad)
    if last.outcome is not VersionOutcome.same:
        return Narrowed(None, None, f"the bad end {bad} does not fail the same way: {_words(last)}")
    low, high = 0, len(releases) - 1
    cannot_tell: set[int] = set()
    while True:
        inside = [index for index in range(low + 1, high) if index not in cannot_tell]
        if not inside:
            break
        middle = min(inside, key=lambda index: (abs(index - (low + high) / 2), index))
        run = outcome_of(releases[middle])
        if run.outcome is VersionOutcome.same:
            high = middle
        elif run.outcome is VersionOutcome.passes:
            low = middle
        else:
            cannot_tell.add(middle)
    skipped = [releases[index] for index in sorted(cannot_tell) if low < index < high]
    reason = f"{', '.join(skipped)} between them cannot tell (fail otherwise or cannot run)" if skipped else None
    return Narrowed(releases[low], releases[high], reason)


def _words(run: VersionRun) -> str:
    return {VersionOutcome.same: "it fails the same way", VersionOutcome.passes: "it passes",
            VersionOutcome.different: f"it fails otherwise ({run.signature})",
            VersionOutcome.cannot_run: f"it cannot run the repro ({run.reason})"}[run.outcome]


def bisect_releases(installer: IndexInstaller | None, request: BisectRequest, repro: Path, inputs: Path | None,
                    signature: str | None, known: Mapping[str, VersionRun],
                    on_step: Callable[[Bisection], None] | None = None) -> Bisection:
    """Bisect `request`'s range on `installer`'s index, running `repro` (with `inputs`) under each
    release it installs; `known` runs (by version) are used as they are. `on_step` sees the
    bisection after every run."""
    state = Bisection(good=request.good, bad=request.bad)

    def report(**changes: object) -> Bisection:
        for name, value in changes.items():
            setattr(state, name, value)
        if on_step is not None:
            on_step(state)
        return state

    if installer is None:
        return report(state="failed", reason="this worker has no package index to install torch from "
                                             "(MINIFY_TORCH_INDEX)")
    try:
        if not parse_version(request.good) < parse_version(request.bad):
            return report(state="failed", reason=f"good ({request.good}) must be older than bad ({request.bad})")
        available = installer.available()
    except (VersionError, OSError, EnvError) as error:
        return report(state="failed", reason=f"cannot list the index's torch versions: {error}")
    missing = [end for end in (request.good, request.bad) if end not in available and end not in known]
    if missing:
        return report(state="failed", reason=f"the index ({installer.index}) has no torch {', '.join(missing)}")
    report(releases=releases_between(available, request.good, request.bad))
    git_versions: dict[str, str | None] = {}

    def outcome_of(version: str) -> VersionRun:
        if version in known:
            run = known[version]
        else:
            fresh = not installer.has(version)
            try:
                env = installer.ensure(version)
            except EnvError as error:
                run = VersionRun(torch=version, outcome=VersionOutcome.cannot_run, reason=str(error))
            else:
                run = run_repro(env, repro, inputs, signature)
            if fresh:
                state.installs += 1
        git_versions[version] = run.git_version
        report(steps=[*state.steps, run])
        return run

    found = narrow(state.releases, outcome_of)
    if found.first_bad is None:
        return report(state="failed", reason=found.reason)
    good_git, bad_git = git_versions.get(found.last_good or ""), git_versions.get(found.first_bad)
    return report(state="done", last_good=found.last_good, first_bad=found.first_bad, reason=found.reason,
                  commits=f"{good_git}..{bad_git}" if good_git and bad_git else None)


BISECT_QUEUE = "minify-bisect"


def for_job(out_dir: Path, report: Report, request: BisectRequest, say: Callable[[str], None],
            save: Callable[[Report], None]) -> Report:
    """Bisect for a job whose artifacts are in `out_dir`: its repro.py under the releases this
    worker's index (MINIFY_TORCH_INDEX) has, the version phase's runs reused. `save` gets the report
    after each run (the job record's result), `say` a line (a log event); report.json and repro.py's
    header say the outcome."""
    from minify_worker.engine import artifacts  # torch: the work horse has it already

    installer = IndexInstaller.from_environ(os.environ)
    inputs = out_dir / "inputs.pt"

    def on_step(state: Bisection) -> None:
        save(report.model_copy(update={"bisect": state.model_copy(deep=True)}))
        say(f"bisect: {bisect_summary(state)}")

    found = bisect_releases(installer, request, out_dir / "repro.py", inputs if inputs.is_file() else None,
                            report.signature, {run.torch: run for run in report.versions}, on_step)
    final = report.model_copy(update={"bisect": found})
    artifacts.rewrite_with_header_lines(out_dir, final, [f"Bisect:           {bisect_summary(found)}"])
    return final


def bisect_job(ticket: dict[str, Any]) -> str:
    """The RQ entry of a bisection asked on demand, on a worker with an index: the job's record
    (its result's `bisect`), its event stream (log lines) and report.json follow it."""
    from rq import get_current_job

    from minify_contract.ledger import TicketKeys, record_fields
    from minify_worker.service.channel import JobChannel

    rq_job = get_current_job()
    assert rq_job is not None, "bisect_job runs inside an RQ work horse"
    stop_on_sigterm()
    keys = TicketKeys.model_validate(ticket["keys"])
    channel = JobChannel(rq_job.connection, keys, ticket["job_id"])
    report = Report.model_validate_json(channel.redis.hget(keys.record, "result"))

    def save(updated: Report) -> None:
        channel.redis.hset(keys.record, mapping=record_fields(result=updated))

    final = for_job(Path(ticket["out_dir"]), report, BisectRequest.model_validate(ticket["request"]), channel.log,
                    save)
    save(final)
    return final.bisect.state if final.bisect else "failed"
