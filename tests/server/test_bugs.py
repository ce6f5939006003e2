"""Bugs, not jobs (issue 22): identical submissions answered once, succeeded jobs grouped into bugs,
retention, a full disk, and the whole of it under CI-like load.

Everything is real: minify-server as a subprocess with its embedded redis-server, RQ workers, the
engine and its sandbox children; cheap test backends (tests/support/backends.py) stand in for a
compiler, so a job takes about a second.
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest
import redis

from minify_contract.bugs import bug_key
from tests.support.backends import ALLOWED, FIVE_BUG_OPS, PREFIX
from tests.support.service import MARKER, Service, start_service, wait_for_status

FIVE_BUGS = {"backend": f"{PREFIX}:fail_on_each_of_five", "failure": {"kind": "compile_error"},
             "culprit": False, "shrink": False}
NOT_REPRODUCIBLE = {"backend": "eager", "culprit": False, "shrink": False}
FINISHED = {"succeeded", "not_reproducible", "failed", "cancelled"}
# Four programs per op, none alike in bytes, all minimizing to the op alone on a float32 input of
# some size: (ops of examples.programs.Chain, input size).
VARIANTS = [(("sin", "{op}"), (8,)), (("{op}", "cos"), (4, 4)), (("abs", "{op}", "sin"), (16,)),
            (("cos", "{op}"), (2, 3))]


def build_program(directory: Path, op: str, index: int) -> Path:
    """Program `index` of VARIANTS around `op`, saved as .pt2 in `directory` (an export: a third of a
    second of CPU)."""
    import torch

    from examples.programs import Chain

    ops, size = VARIANTS[index]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{op}-{index}.pt2"
    torch.export.save(torch.export.export(Chain(tuple(name.format(op=op) for name in ops)), (torch.randn(*size),)),
                      path)
    return path


def build_programs(directory: Path) -> dict[str, list[Path]]:
    """Twenty programs, four per op of FIVE_BUG_OPS: five bugs under `fail_on_each_of_five`."""
    return {op: [build_program(directory, op, index) for index in range(len(VARIANTS))] for op in FIVE_BUG_OPS}


@pytest.fixture(scope="module")
def bug_programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    return build_programs(tmp_path_factory.mktemp("bug-programs"))


def post(client: httpx.Client, program: Path, spec: dict, **params: str) -> httpx.Response:
    return client.post("/v1/jobs", files={"program": (program.name, program.read_bytes())},
                       data={"spec": json.dumps(spec)}, params=params)


# A retention sweep every half second (the default is minutes), for the tests of the sweep.
SWEEP_OFTEN = {"MINIFY_RETENTION_SWEEP_INTERVAL_S": "0.5"}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """The module's service with a worker, its retention sweep every half second (no job of it is
    backdated, so the sweep deletes nothing): the sweep test runs on it, one worker start (torch's
    imports, some 10 s of CPU) fewer than a service of its own."""
    with start_service(tmp_path_factory.mktemp("bugs") / "data", workers=1, env=SWEEP_OFTEN) as running:
        yield running


@pytest.fixture(scope="module")
def bugless_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """A service of its own with a worker and the sweep every half second, for the two tests whose
    claims need a service with no bug listed (the other service's tests file five): the retention
    test, which leaves it so (its bug unlisted, its last job cancelled), then the load test, which
    checks that first. One worker start (torch's imports, some 10 s of CPU) fewer than a service each."""
    with start_service(tmp_path_factory.mktemp("bugless") / "data", workers=1, env=SWEEP_OFTEN) as running:
        yield running


def assert_no_bug_listed(service: Service) -> None:
    """The precondition of a test whose counts are its claim: no bug and no job that could become one."""
    with service.client() as client:
        assert client.get("/v1/bugs").json()["total"] == 0
        open_jobs = [job for job in client.get("/v1/jobs", params={"limit": 500}).json()["jobs"]
                     if job["status"] in ("queued", "running")]
    assert open_jobs == [], open_jobs


@pytest.fixture(scope="module")
def idle_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """No worker: submitted jobs stay queued."""
    with start_service(tmp_path_factory.mktemp("idle") / "data", workers=0) as running:
        yield running


# -- 1. identical submissions, one minimization ---------------------------------------------------


def test_an_identical_submission_gets_the_queued_job_and_force_makes_a_new_one(
        idle_service: Service, bug_programs: dict[str, list[Path]]) -> None:
    program = bug_programs["relu"][0]
    with idle_service.client() as client:
        first = post(client, program, FIVE_BUGS)
        again = post(client, program, {**FIVE_BUGS, "limits": {"job_timeout_s": 3600}})  # the defaults spelled out
        forced = post(client, program, FIVE_BUGS, force="true")
        other_spec = post(client, program, {**FIVE_BUGS, "shrink": True})
        total = client.get("/v1/jobs").json()["total"]
        for response in (first, forced, other_spec):
            client.delete(f"/v1/jobs/{response.json()['id']}")
    assert first.status_code == 201 and first.json()["deduplicated"] is False
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"] and again.json()["deduplicated"] is True
    assert again.json()["status"] == "queued"
    assert forced.status_code == 201 and forced.json()["id"] != first.json()["id"]
    assert other_spec.status_code == 201 and other_spec.json()["id"] not in (first.json()["id"], forced.json()["id"])
    assert total == 3


def test_a_cancelled_job_is_not_reused(idle_service: Service, bug_programs: dict[str, list[Path]]) -> None:
    program = bug_programs["relu"][1]
    with idle_service.client() as client:
        first = post(client, program, FIVE_BUGS).json()["id"]
        assert client.delete(f"/v1/jobs/{first}").json()["status"] == "cancelled"
        second = post(client, program, FIVE_BUGS)
        client.delete(f"/v1/jobs/{second.json()['id']}")
    assert second.status_code == 201 and second.json()["id"] != first


def test_a_refused_upload_sent_again_is_refused_again_at_once(idle_service: Service, tmp_path: Path) -> None:
    not_a_program = tmp_path / "model.pt2"
    not_a_program.write_text("print('hello')\n")
    with idle_service.client() as client:
        started = time.monotonic()
        answers = [post(client, not_a_program, FIVE_BUGS) for _ in range(2)]
        took = time.monotonic() - started
    assert [answer.status_code for answer in answers] == [415, 415]
    assert took < 5  # nothing of the refused one stands in the way of the next


def test_ten_identical_concurrent_submissions_make_one_job(idle_service: Service,
                                                         bug_programs: dict[str, list[Path]]) -> None:
    program = bug_programs["tanh"][2]
    answers: list[httpx.Response] = []
    start = threading.Barrier(10)

    def submit() -> None:
        with idle_service.client() as own:
            start.wait()
            answers.append(post(own, program, FIVE_BUGS))

    threads = [threading.Thread(target=submit) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with idle_service.client() as client:
        client.delete(f"/v1/jobs/{answers[0].json()['id']}")
    assert sorted(answer.status_code for answer in answers) == [200] * 9 + [201]
    assert len({answer.json()["id"] for answer in answers}) == 1


# -- 2. bugs ----------------------------------------------------------------------------------------


def test_succeeded_jobs_are_grouped_into_bugs_by_signature_and_graph_shape(
        service: Service, bug_programs: dict[str, list[Path]]) -> None:
    relu_small, relu_square = bug_programs["relu"][0], bug_programs["relu"][1]  # other ops, other sizes
    with service.client() as client:
        job_ids = [post(client, path, FIVE_BUGS).json()["id"]
                   for path in (relu_small, relu_square, bug_programs["exp"][0])]
        finals = [wait_for_status(client, job_id, FINISHED) for job_id in job_ids]
        assert [final["status"] for final in finals] == ["succeeded"] * 3, finals
        again = post(client, relu_small, FIVE_BUGS)
        not_reproducible = post(client, relu_small, NOT_REPRODUCIBLE).json()["id"]
        assert wait_for_status(client, not_reproducible, FINISHED)["status"] == "not_reproducible"
        retried = post(client, relu_small, NOT_REPRODUCIBLE)
        bugs = client.get("/v1/bugs").json()
        relu_bug = client.get(f"/v1/bugs/{finals[0]['bug']}").json()
        unknown = client.get("/v1/bugs/0123456789abcdef01234567")
        report = client.get(f"/v1/jobs/{job_ids[0]}/artifacts/report.json").json()
        repro = client.get(relu_bug["repro"])
        metrics = client.get("/metrics").text
        client.delete(f"/v1/jobs/{retried.json()['id']}")
    assert again.status_code == 200 and again.json()["id"] == job_ids[0] and again.json()["status"] == "succeeded"
    assert retried.status_code == 201 and retried.json()["id"] != not_reproducible  # ended otherwise: not reused
    assert finals[0]["bug"] == finals[1]["bug"] != finals[2]["bug"]
    assert report["bug"] == finals[0]["bug"] == bug_key(report["signature"], report["graph_shape_hash"])
    assert report["signature"] == "RuntimeError: injected failure on relu"
    assert bugs["total"] == 2
    assert [bug["count"] for bug in bugs["bugs"]] == [1, 2]  # most recently seen first: exp, then relu
    assert relu_bug["count"] == 2 and set(relu_bug["job_ids"]) == set(job_ids[:2])
    assert relu_bug["representative"] == job_ids[0]
    assert relu_bug["signature"] == report["signature"] and relu_bug["failure_kind"] == "compile_error"
    assert relu_bug["backend"] == FIVE_BUGS["backend"] and relu_bug["device"] == "cpu"
    assert relu_bug["first_seen"] <= relu_bug["last_seen"]
    assert repro.status_code == 200 and "injected failure on relu" in repro.text
    assert unknown.status_code == 404
    assert "minify_bugs 2.0" in metrics
    data_bytes = next(line for line in metrics.splitlines() if line.startswith("minify_data_dir_bytes "))
    assert float(data_bytes.split()[1]) > 0


def test_a_succeeded_job_no_worker_filed_is_filed_by_the_servers_sweep(
        service: Service, bug_programs: dict[str, list[Path]]) -> None:
    with service.client() as client:
        job_id = post(client, bug_programs["tanh"][3], FIVE_BUGS).json()["id"]
        bug = wait_for_status(client, job_id, FINISHED)["bug"]
        store = _redis(service)
        # As a worker leaves a job whose ticket names no bug keys (queued before the server knew of bugs).
        store.hdel(f"minify:job:{job_id}", "bug")
        store.delete(f"minify:bug:{bug}", f"minify:bug:{bug}:jobs")
        store.zrem("minify:bugs", bug)
        _wait_until(lambda: client.get(f"/v1/jobs/{job_id}").json().get("bug") is not None)
        filed = client.get(f"/v1/bugs/{bug}").json()
    assert filed["count"] == 1 and filed["representative"] == job_id
    assert filed["signature"] == "RuntimeError: injected failure on tanh"


def run_client(service: Service, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minify_client.cli", *args, "--server", service.url],
                          capture_output=True, text=True, timeout=180, cwd=cwd)


def test_the_client_says_same_program_waits_on_that_job_and_lists_bugs(
        service: Service, bug_programs: dict[str, list[Path]], tmp_path: Path) -> None:
    program = bug_programs["neg"][3]
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(FIVE_BUGS))
    first = run_client(service, "submit", str(program), "--spec", str(spec), "--wait", "--out", "first",
                       cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    second = run_client(service, "submit", str(program), "--spec", str(spec), "--wait", "--out", "second",
                        cwd=tmp_path)
    forced = run_client(service, "submit", str(program), "--spec", str(spec), "--force", "--json", cwd=tmp_path)
    listing = run_client(service, "bugs", cwd=tmp_path)
    with service.client() as client:
        job_id = json.loads(forced.stdout)["id"]
        wait_for_status(client, job_id, FINISHED)
        first_id = client.get("/v1/jobs", params={"limit": 2}).json()["jobs"][1]["id"]
        bug = client.get(f"/v1/jobs/{job_id}").json()["bug"]
    one = run_client(service, "bugs", bug, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert f"same program as job {first_id} (succeeded)" in second.stderr
    assert (tmp_path / "second" / "repro.py").read_bytes() == (tmp_path / "first" / "repro.py").read_bytes()
    assert json.loads(forced.stdout)["deduplicated"] is False and job_id != first_id
    assert "injected failure on neg" in listing.stdout and listing.stdout.startswith("BUG")
    assert one.returncode == 0 and "jobs:       2" in one.stdout, one.stdout
    assert f"/v1/jobs/{first_id}/artifacts/repro.py" in one.stdout


def test_a_bug_closed_as_fixed_reopens_when_a_job_finds_it_again_but_one_closed_as_wont_fix_stays_closed(
        service: Service, bug_programs: dict[str, list[Path]], tmp_path: Path) -> None:
    programs = bug_programs["sigmoid"]  # four programs, one bug
    with service.client() as client:
        first = post(client, programs[0], FIVE_BUGS).json()["id"]
        bug = wait_for_status(client, first, FINISHED)["bug"]
    no_reason = run_client(service, "bugs", "close", bug, cwd=tmp_path)
    closed = run_client(service, "bugs", "close", bug, "--reason", "fixed by #123", "--by", "alice", cwd=tmp_path)
    twice = run_client(service, "bugs", "close", bug, "--reason", "again", cwd=tmp_path)
    listed = run_client(service, "bugs", "--status", "closed", cwd=tmp_path)
    with service.client() as client:
        wait_for_status(client, post(client, programs[1], FIVE_BUGS).json()["id"], FINISHED)
        regressed = client.get(f"/v1/bugs/{bug}").json()
        open_ids = [found["id"] for found in client.get("/v1/bugs", params={"status": "open"}).json()["bugs"]]
    wont_fix = run_client(service, "bugs", "close", bug, "--reason", "it fails on purpose", "--resolution", "wont_fix",
                          "--by", "bob", cwd=tmp_path)
    with service.client() as client:
        wait_for_status(client, post(client, programs[2], FIVE_BUGS).json()["id"], FINISHED)
        stays = client.get(f"/v1/bugs/{bug}").json()
    reopened = run_client(service, "bugs", "reopen", bug, "--reason", "seen in CI", "--by", "carol", cwd=tmp_path)
    shown = run_client(service, "bugs", bug, cwd=tmp_path)

    assert no_reason.returncode == 2 and "needs --reason" in no_reason.stderr
    assert closed.returncode == 0, closed.stderr
    assert closed.stdout.startswith(f"bug {bug}: closed (fixed) by alice") and "fixed by #123" in closed.stdout
    assert "a job that finds it again reopens it" in closed.stdout
    assert twice.returncode == 1 and "409" in twice.stderr and "closed already" in twice.stderr
    assert bug in listed.stdout and "closed: fixed" in listed.stdout
    assert regressed["status"] == "open" and bug in open_ids  # a new job after a close as fixed: regressed
    assert [change["action"] for change in regressed["history"]] == ["closed", "regressed"]
    assert regressed["history"][0]["by"] == "alice" and regressed["history"][1]["job"] in regressed["job_ids"]
    assert wont_fix.returncode == 0 and "it stays closed" in wont_fix.stdout
    assert stays["status"] == "closed" and stays["jobs_since_closed"] == 1 and stays["count"] == 3
    assert stays["closure"]["resolution"] == "wont_fix" and stays["closure"]["by"] == "bob"
    assert reopened.returncode == 0 and reopened.stdout.strip() == f"bug {bug}: open"
    history = [line for line in shown.stdout.splitlines() if line.startswith("history:")]
    assert [re.sub(r"^history:\s+\S+ \S+ ", "", line) for line in history] == [
        "closed (fixed) by alice: fixed by #123", f"regressed: {regressed['history'][1]['reason']}",
        "closed (won't fix) by bob: it fails on purpose", "reopened by carol: seen in CI"]


def test_the_client_shows_a_jobs_log_and_what_a_not_reproducible_original_printed(
        service: Service, bug_programs: dict[str, list[Path]], tmp_path: Path) -> None:
    spec = {"backend": f"{PREFIX}:say_then_fail_on_cos", "culprit": False, "shrink": False}  # no cos: it passes
    with service.client() as client:
        job_id = post(client, bug_programs["neg"][0], spec).json()["id"]
        assert wait_for_status(client, job_id, FINISHED)["status"] == "not_reproducible"
    status = run_client(service, "status", job_id, cwd=tmp_path)
    logs = run_client(service, "logs", job_id, cwd=tmp_path)
    unknown = run_client(service, "logs", "0" * 32, cwd=tmp_path)

    assert status.returncode == 0, status.stderr
    assert "next:      the original passed 3 of 3 runs on tests.support.backends:say_then_fail_on_cos" in status.stdout
    assert "the original's output in the worker:\n  say_then_fail_on_cos: compiling" in status.stdout
    assert logs.returncode == 0, logs.stderr
    assert f"job {job_id}: an attempt starts on worker" in logs.stdout
    assert "the attempt ended after" in logs.stdout and logs.stdout.rstrip().endswith(": not_reproducible")
    assert unknown.returncode == 1 and "no job" in unknown.stderr


# -- 3. retention and a full disk ----------------------------------------------------------------


def _redis(service: Service) -> redis.Redis:
    return redis.Redis.from_url(service.redis_url, decode_responses=True)


def _backdate_job(store: redis.Redis, job_id: str, days: float) -> None:
    when = (datetime.now(timezone.utc) - timedelta(days=days)).isoformat()
    store.hset(f"minify:job:{job_id}", mapping={"finished_at": when, "created_at": when})


def _backdate_bug(store: redis.Redis, bug_id: str, days: float) -> None:
    when = datetime.now(timezone.utc) - timedelta(days=days)
    store.hset(f"minify:bug:{bug_id}", "last_seen", when.isoformat())
    store.zadd("minify:bugs", {bug_id: when.timestamp()})


def _wait_until(condition: object, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "the retention sweep did not run"
        time.sleep(0.2)


def test_retention_deletes_ended_jobs_but_keeps_a_listed_bugs_representative(
        bugless_service: Service, bug_programs: dict[str, list[Path]]) -> None:
    # No other bug may be listed; MINIFY_RETENTION_DAYS: the default, 30.
    running = bugless_service
    assert_no_bug_listed(running)
    with running.client() as client:
        representative, member = (post(client, path, FIVE_BUGS).json()["id"] for path in bug_programs["sigmoid"][:2])
        other = post(client, bug_programs["sigmoid"][2], NOT_REPRODUCIBLE).json()["id"]
        finals = {job_id: wait_for_status(client, job_id, FINISHED) for job_id in (representative, member, other)}
        bug = finals[representative]["bug"]
        assert finals[member]["bug"] == bug and client.get(f"/v1/bugs/{bug}").json()["representative"] == representative
        store = _redis(running)
        jobs = running.data_dir / "jobs"
        program_sha = store.hget(f"minify:job:{other}", "program_sha256")
        old_blob = running.data_dir / "blobs" / program_sha[:2] / program_sha
        ancient = time.time() - 40 * 86400
        os.utime(old_blob, (ancient, ancient))
        for job_id in (representative, other):
            _backdate_job(store, job_id, 40)  # ended 40 days ago; the bug was seen today (member)
        _wait_until(lambda: client.get(f"/v1/jobs/{other}").status_code == 404)
        assert client.get(f"/v1/jobs/{representative}").status_code == 200
        assert client.get(f"/v1/jobs/{representative}/artifacts/repro.py").status_code == 200
        assert client.get(f"/v1/jobs/{member}").status_code == 200
        assert not (jobs / other).exists() and (jobs / representative / "out" / "repro.py").is_file()
        assert store.keys(f"minify:job:{other}*") == []
        assert not old_blob.exists()
        reposted = post(client, bug_programs["sigmoid"][2], NOT_REPRODUCIBLE)
        assert reposted.status_code == 201

        _backdate_job(store, member, 40)
        _backdate_bug(store, bug, 40)  # the bug was last seen 40 days ago: unlisted, then its jobs go
        # one sweep deletes the bug's jobs one after the other, each record then its folder: wait
        # for both, not the first
        _wait_until(lambda: all(client.get(f"/v1/jobs/{job_id}").status_code == 404 and not (jobs / job_id).exists()
                                for job_id in (representative, member)))
        assert client.get(f"/v1/bugs/{bug}").status_code == 404
        assert client.get("/v1/bugs").json()["total"] == 0
        assert not (jobs / representative).exists() and not (jobs / member).exists()
        assert store.keys(f"minify:bug:{bug}*") == []
        metrics = client.get("/metrics").text
        fresh = post(client, bug_programs["sigmoid"][0], FIVE_BUGS)  # its content key went with the job
        # The load test runs on this service next and counts bugs: no job of this one may go on
        # (a cancelled job is never reused, test_a_cancelled_job_is_not_reused).
        for job_id in (fresh.json()["id"], reposted.json()["id"]):
            if client.get(f"/v1/jobs/{job_id}").json()["status"] in ("queued", "running"):
                client.delete(f"/v1/jobs/{job_id}")
            wait_for_status(client, job_id, FINISHED)
    assert "minify_bugs 0.0" in metrics
    assert fresh.status_code == 201


def test_an_upload_the_disk_cannot_hold_is_refused_with_507_and_nothing_kept(
        tmp_path: Path, bug_programs: dict[str, list[Path]]) -> None:
    limit = 1024 * 1024
    big = tmp_path / "big.pt2"
    big.write_bytes(bug_programs["relu"][0].read_bytes() + os.urandom(2 * limit))
    data_dir = tmp_path / "data"
    with start_service(data_dir, workers=0, file_size_limit=limit) as running, running.client() as client:
        refused = post(client, big, FIVE_BUGS)
        left = sorted(str(path.relative_to(data_dir)) for folder in ("tmp", "blobs", "jobs")
                      for path in (data_dir / folder).rglob("*"))
        jobs = client.get("/v1/jobs").json()["total"]
        accepted = post(client, bug_programs["relu"][0], FIVE_BUGS)
        client.delete(f"/v1/jobs/{accepted.json()['id']}")
    assert refused.status_code == 507, refused.text
    assert "disk is full" in refused.json()["error"] and "File too large" in refused.json()["error"]
    assert left == [] and jobs == 0
    assert accepted.status_code == 201


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs: a disk that really fills up (ENOSPC). Needs the right to mount (root here;
    skipped where mounting is refused)."""
    mount_point = tmp_path / "small-disk"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def test_an_upload_that_fills_the_disk_is_refused_with_507_and_the_space_comes_back(
        small_disk: Path, bug_programs: dict[str, list[Path]], tmp_path: Path) -> None:
    big = tmp_path / "big.pt2"
    big.write_bytes(bug_programs["relu"][0].read_bytes() + os.urandom(6 * 1024 * 1024))
    data_dir = small_disk / "data"
    with start_service(data_dir, workers=0) as running, running.client() as client:
        free_before = os.statvfs(small_disk).f_bavail
        refused = post(client, big, FIVE_BUGS)
        free_after = os.statvfs(small_disk).f_bavail
        left = sorted(str(path.relative_to(data_dir)) for folder in ("tmp", "blobs", "jobs")
                      for path in (data_dir / folder).rglob("*"))
        accepted = post(client, bug_programs["relu"][0], FIVE_BUGS)
        client.delete(f"/v1/jobs/{accepted.json()['id']}")
    assert refused.status_code == 507, refused.text
    assert "No space left on device (errno 28)" in refused.json()["error"]
    assert left == [] and free_after == free_before
    assert accepted.status_code == 201


def test_a_worker_that_cannot_write_an_artifact_fails_the_job_naming_it(
        idle_service: Service, bug_programs: dict[str, list[Path]]) -> None:
    limit = 64 * 1024
    # A config value repro.py records, larger than the worker may write in one file (and short of
    # the 128 KiB an argument of the sandbox's command line may have).
    spec = {**FIVE_BUGS, "config": {"trace.debug_dir": "x" * 100_000}}

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = {**os.environ, MARKER: idle_service.marker, **ALLOWED}
    # Preloaded without inductor's warm-up (a compile, whose files would meet the limit first): the
    # job's sandbox forks from the worker's imports (the spawned path has its own tests, test_gpu_safety).
    worker = subprocess.Popen([sys.executable, "-m", "minify_worker.cli", "--redis-url", idle_service.redis_url,
                               "--queues", "cpu", "--name", "small-disk", "--no-warm-up"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=limited)
    try:
        with idle_service.client() as client:
            job_id = post(client, bug_programs["exp"][1], spec).json()["id"]
            final = wait_for_status(client, job_id, FINISHED, timeout_s=180)
            out = idle_service.data_dir / "jobs" / job_id / "out"
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
    assert final["status"] == "failed", final
    assert final["reason"].startswith("could not write repro.py: File too large (errno 27)"), final["reason"]
    assert final["bug"] is None
    assert not (out / "repro.py").exists()  # no partial file left


# -- 4. load ------------------------------------------------------------------------------------------


# How often each load client asks about each of its jobs that has not ended (bench/bugs.py polls
# every 0.5 s). What the load test claims (no job lost, the counts, the p99 of every API request
# while the jobs run) does not rest on the rate: every 2 s still times about a quarter of the 8,155
# requests the 0.5 s made in CI (135 s), some 2,000 with the 200 POSTs of the burst, so the p99
# still rests on some 20 requests above it; at 3.2 ms of CPU a status read (server 2.0, client
# 1.2; measured here) the 0.5 s spent some 26 CPU-s answering the same question four times as
# often. minify-client itself follows a job by its event stream, not by polling.
LOAD_POLL_S = 2.0


def test_200_submissions_from_10_clients_make_20_minimizations_and_5_bugs(
        bugless_service: Service, bug_programs: dict[str, list[Path]], monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.bugs
    from bench.bugs import run_load

    monkeypatch.setattr(bench.bugs, "POLL_S", LOAD_POLL_S)
    running = bugless_service
    assert_no_bug_listed(running)  # the counts are the claim
    load_before = os.getloadavg()[0]
    result = run_load(running.url, bug_programs, clients=10, rounds=10, headers=running.headers)
    print(f"\n{result.summary()} (load average {load_before:.1f} before the run, {os.cpu_count()} cores)")
    assert result.lost == [] and result.errors == []
    assert result.created == 20 and result.deduplicated == 180
    assert Counter(result.statuses.values()) == {"succeeded": 20}
    assert result.bug_counts == {f"RuntimeError: injected failure on {op}": 4 for op in FIVE_BUG_OPS}
    if result.p99_s >= 0.1 and load_before > (os.cpu_count() or 1):
        # Others' processes held every core before the run started: the figure says nothing of the server.
        pytest.xfail(f"p99 {result.p99_s * 1000:.0f} ms on a machine already at load {load_before:.1f} "
                     f"on {os.cpu_count()} cores")
    assert result.p99_s < 0.1, result.summary()
