"""Bisecting torch releases (minify_worker/service/versions/bisect.py): the search, pure, and the bisection
with real uv installs from an index of stand-in torch wheels (tests/worker/service/test_versions_envs.py's: a
package named torch that only knows its version). A real repro.py needs a real torch, so the
script run under each release is a stand-in too: it speaks repro.py's protocol (`repro passed`, or
`repro failed with: SIGNATURE` and a non-zero exit) and fails on the releases named in it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from minify_contract.models import Bisection, BisectRequest, JobState, VersionOutcome, VersionRun
from minify_contract.summaries import bisect_summary
from minify_worker.service.versions.bisect import bisect_releases, max_installs, narrow, releases_between
from minify_worker.service.versions.envs import IndexInstaller
from tests.client.test_client_cli import run_cli
from tests.support.scripted_server import Exchange, job_status
from tests.worker.service.test_versions_envs import stand_in_torch_wheel

SIGNATURE = "RuntimeError: injected failure on relu"
RELEASES = ["2.11.0", "2.12.0", "2.13.0", "2.14.1", "2.15.0"]


def table(outcomes: dict[str, str]) -> tuple[list[str], Callable[[str], VersionRun]]:
    """The `outcome_of` of a fixed table, and the versions it was asked, in order."""
    asked: list[str] = []

    def outcome_of(version: str) -> VersionRun:
        asked.append(version)
        return VersionRun(torch=version, outcome=VersionOutcome(outcomes[version]))

    return asked, outcome_of


def test_the_search_finds_the_first_bad_release_within_log2_n_plus_2_runs() -> None:
    releases = [f"2.{minor}.0" for minor in range(0, 17)]  # 17 releases, the bug since 2.11.0
    asked, outcome_of = table({version: "passes" if int(version.split(".")[1]) < 11 else "same"
                               for version in releases})

    found = narrow(releases, outcome_of)

    assert (found.last_good, found.first_bad, found.reason) == ("2.10.0", "2.11.0", None)
    assert asked[:2] == ["2.0.0", "2.16.0"] and len(asked) <= max_installs(len(releases)) == 6


def test_a_release_that_cannot_tell_is_skipped_and_said_so() -> None:
    releases = ["2.11.0", "2.12.0", "2.13.0", "2.14.1"]
    _, outcome_of = table({"2.11.0": "passes", "2.12.0": "cannot_run", "2.13.0": "same", "2.14.1": "same"})

    found = narrow(releases, outcome_of)

    assert (found.last_good, found.first_bad) == ("2.11.0", "2.13.0")
    assert found.reason == "2.12.0 between them cannot tell (fail otherwise or cannot run)"


def test_ends_that_do_not_pass_or_fail_as_told_stop_the_search() -> None:
    _, passing_bad = table({"2.11.0": "passes", "2.15.0": "passes"})
    _, failing_good = table({"2.11.0": "same", "2.15.0": "same"})

    assert narrow(["2.11.0", "2.15.0"], passing_bad).reason == (
        "the bad end 2.15.0 does not fail the same way: it passes")
    assert narrow(["2.11.0", "2.15.0"], failing_good).reason == (
        "the good end 2.11.0 does not pass: it fails the same way")


def test_nightlies_and_pre_releases_take_part_only_when_an_end_is_one() -> None:
    available = ["2.11.0", "2.12.0", "2.13.0rc1", "2.13.0", "2.14.0.dev20260101", "2.14.0", "2.15.0"]

    assert releases_between(available, "2.11.0", "2.15.0") == ["2.11.0", "2.12.0", "2.13.0", "2.14.0", "2.15.0"]
    assert releases_between(available, "2.13.0", "2.14.0.dev20260201") == [
        "2.13.0", "2.14.0.dev20260101", "2.14.0.dev20260201"]


STAND_IN_REPRO = '''
import sys
import torch

if torch.__version__ in {bad!r}:
    print("repro failed with: {signature}", file=sys.stderr)
    sys.exit(1)
print(f"repro passed: no failure (torch {{torch.__version__}})")
'''


@pytest.fixture
def index(tmp_path: Path) -> Path:
    folder = tmp_path / "wheels"
    folder.mkdir()
    for version in ("9.0.0", "9.1.0", "9.2.0", "9.3.0", "9.4.0", "9.5.0rc1"):
        stand_in_torch_wheel(folder, version)
    return folder


def test_the_index_lists_its_torch_versions(tmp_path: Path, index: Path) -> None:
    installer = IndexInstaller(str(index), tmp_path / "cache", max_bytes=1 << 30)
    assert installer.available() == ["9.0.0", "9.1.0", "9.2.0", "9.3.0", "9.4.0", "9.5.0rc1"]


def test_a_bisection_installs_the_releases_it_needs_and_names_the_first_bad_one(tmp_path: Path, index: Path) -> None:
    repro = tmp_path / "repro.py"
    repro.write_text(STAND_IN_REPRO.format(bad={"9.2.0", "9.3.0", "9.4.0"}, signature=SIGNATURE))
    installer = IndexInstaller(str(index), tmp_path / "cache", max_bytes=1 << 30)
    known = {"9.4.0": VersionRun(torch="9.4.0", git_version="standin9.4.0", outcome=VersionOutcome.same)}
    seen: list[int] = []

    found = bisect_releases(installer, BisectRequest(good="9.0.0", bad="9.4.0"), repro, None, SIGNATURE, known,
                            on_step=lambda state: seen.append(len(state.steps)))

    assert (found.state, found.last_good, found.first_bad) == ("done", "9.1.0", "9.2.0"), found
    assert found.commits == "standin9.1.0..standin9.2.0"
    assert found.releases == ["9.0.0", "9.1.0", "9.2.0", "9.3.0", "9.4.0"]
    assert found.installs == len(found.steps) - 1 <= max_installs(5) - 1  # 9.4.0 was known
    assert [run.torch for run in found.steps][:2] == ["9.0.0", "9.4.0"]
    assert seen[-1] == len(found.steps)
    assert bisect_summary(found).startswith("first bad 9.2.0 (last good 9.1.0; git standin9.1.0..standin9.2.0)")


def test_a_bisection_without_an_index_or_with_ends_it_lacks_says_why(tmp_path: Path, index: Path) -> None:
    repro = tmp_path / "repro.py"
    installer = IndexInstaller(str(index), tmp_path / "cache", max_bytes=1 << 30)

    no_index = bisect_releases(None, BisectRequest(good="9.0.0", bad="9.4.0"), repro, None, SIGNATURE, {})
    lacking = bisect_releases(installer, BisectRequest(good="8.0.0", bad="9.4.0"), repro, None, SIGNATURE, {})

    assert (no_index.state, no_index.reason) == (
        "failed", "this worker has no package index to install torch from (MINIFY_TORCH_INDEX)")
    assert lacking.state == "failed" and lacking.reason.endswith("has no torch 8.0.0")


def test_minify_client_bisect_starts_it_prints_each_run_and_the_first_bad_release(server: Any) -> None:
    """The client's side, against a scripted server: POST, then the job's result followed until done."""
    steps = [VersionRun(torch=version, outcome=VersionOutcome(outcome), git_version=f"g{version}")
             for version, outcome in (("2.11.0", "passes"), ("2.15.0", "same"), ("2.13.0", "passes"),
                                      ("2.14.1", "same"))]
    polls = iter([Bisection(good="2.11.0", bad="2.15.0", steps=steps[:2], releases=RELEASES),
                  Bisection(good="2.11.0", bad="2.15.0", steps=steps, releases=RELEASES, state="done",
                            last_good="2.13.0", first_bad="2.14.1", commits="g2.13.0..g2.14.1", installs=3)])
    status = job_status("j1", JobState.succeeded)

    def polled(exchange: Exchange) -> None:
        bisection = next(polls)
        result = status.result.model_copy(update={"bisect": bisection})
        exchange.send_json(200, status.model_copy(update={"result": result}).model_dump(mode="json"))

    server.route("POST", "/v1/jobs/j1/bisect", lambda exchange: exchange.send_json(
        202, Bisection(good="2.11.0", bad="2.15.0").model_dump(mode="json")))
    server.route("GET", "/v1/jobs/j1", polled)

    done = run_cli("bisect", "j1", "--good", "2.11.0", "--bad", "2.15.0", "--server", server.url)

    assert done.returncode == 0, done.stderr
    assert json.loads(server.requests_to("POST", "/v1/jobs/j1/bisect")[0].body) == {"good": "2.11.0", "bad": "2.15.0"}
    assert done.stdout.splitlines() == [
        "  torch 2.11.0: passes", "  torch 2.15.0: same", "  torch 2.13.0: passes", "  torch 2.14.1: same",
        "first bad 2.14.1 (last good 2.13.0; git g2.13.0..g2.14.1), 3 installs, 4 runs"]
