"""The service under stress: dying workers, a restarted Redis, cancellation, load.

Everything is real: minify-server as a subprocess, its embedded redis-server, RQ worker processes
forking work horses, the engine with its sandbox children; test backends stand in for the compiler
(the README's service example, tests/test_readme.py, takes a real inductor bug through a service).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from redis import Redis

from bench.bugs import percentile
from minify_worker.sandbox.processes import process_stats
from minify_worker.service.rqworker import MAINTENANCE_LOCK_S, MinifyQueue, MinifyWorker
from tests.support.backends import ALLOWED, PREFIX
from tests.support.service import (
    CULPRIT_FLOOR,
    MARKER,
    Service,
    read_events,
    start_service,
    wait_for_culprit,
    wait_for_status,
)

FAIL_ON_RELU = {"backend": f"{PREFIX}:fail_on_relu", "failure": {"kind": "compile_error"}}
# Hangs compiling any graph with relu, with a `sleep` grandchild: a job that runs until cancelled.
HANG_ON_RELU = {"backend": f"{PREFIX}:hang_with_grandchild_on_relu",
                "failure": {"kind": "timeout"}, "limits": {"candidate_timeout_s": 120}}
FINISHED = {"succeeded", "not_reproducible", "failed", "cancelled"}
# Runs until cancelled (its original hangs), with no grandchild that could outlive a killed worker.
HANGS = {"backend": f"{PREFIX}:hang_on_relu", "failure": {"kind": "timeout"},
         "limits": {"candidate_timeout_s": 120}}
# A worker silent 1 + 2 s is dead; every worker cleans up (re-queues dead workers' jobs) every second.
FAST_HEARTBEAT = ["--heartbeat-interval", "1", "--heartbeat-grace", "2", "--maintenance-interval", "1"]


# The culprit phase's floor for the module's worker (CULPRIT_FLOOR): a second, not the suite's 5 s.
# No test here reads what the phase found, only that it ran.


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with start_service(tmp_path_factory.mktemp("service") / "data", workers=1, env=CULPRIT_FLOOR) as running:
        yield running


def submit(client: httpx.Client, program: Path, spec: dict) -> str:
    """A new job every time (force: identical submissions would otherwise share one, tests/server/test_bugs.py)."""
    response = client.post("/v1/jobs", files={"program": (program.name, program.read_bytes())},
                           data={"spec": json.dumps(spec)}, params={"force": "true"})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def children_of(pid: int) -> list[int]:
    return [child for child, fields in process_stats() if int(fields[1]) == pid and fields[0] != "Z"]


def work_horse_of(status: dict) -> int:
    """The RQ work horse running a job: the child of the worker named in its record ("host-pid")."""
    worker_pid = int(status["worker"].rsplit("-", 1)[1])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        horses = children_of(worker_pid)
        if horses:
            return horses[0]
        time.sleep(0.05)
    raise AssertionError(f"worker {worker_pid} has no work horse")


def test_job_whose_work_horse_is_sigkilled_is_retried_and_succeeds(service: Service,
                                                                  programs: dict[str, Path]) -> None:
    with service.client() as client:
        job_id = submit(client, programs["chain"], FAIL_ON_RELU)
        running = wait_for_status(client, job_id, {"running"} | FINISHED)
        assert running["status"] == "running"
        os.kill(work_horse_of(running), signal.SIGKILL)
        final = wait_for_status(client, job_id, FINISHED, timeout_s=180)
        events = read_events(client, job_id)
    assert final["status"] == "succeeded", final
    assert final["attempts"] == 2
    messages = [event.data.get("message", "") for event in events if event.event == "status"]
    assert any("work horse killed by SIGKILL; re-queued" in message for message in messages), messages
    # The last status; the stream then goes on to the culprit phase's end (docs/service.md).
    assert [event.data["status"] for event in events if event.event == "status"][-1] == "succeeded"
    assert events[-1].event == "culprit"


def sleeping_grandchild(pids: set[int]) -> int | None:
    """The `sleep` a hanging test backend starts (tests/support/backends.py, `hang_on`): a candidate
    hangs now. Counting the job's processes cannot tell: its horse, fork server and the server's
    guardian come first, and short-lived children (prepare, the environment call) come and go."""
    for pid in sorted(pids):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "sleep":
                return pid
        except OSError:
            continue
    return None


def test_cancelling_a_running_job_ends_it_cancelled_with_no_children_left(service: Service,
                                                                          programs: dict[str, Path]) -> None:
    with service.client() as client:
        idle = set(service.pids())  # server, redis-server, worker
        job_id = submit(client, programs["relu_cos"], HANG_ON_RELU)
        wait_for_status(client, job_id, {"running"})
        deadline = time.monotonic() + 60
        while (hanging := sleeping_grandchild(set(service.pids()) - idle)) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert hanging is not None, "the job never reached a hanging candidate"
        started = time.monotonic()
        response = client.delete(f"/v1/jobs/{job_id}")
        assert response.status_code == 202
        final = wait_for_status(client, job_id, FINISHED, timeout_s=30)
        took = time.monotonic() - started
        assert final["status"] == "cancelled", final
        deadline = time.monotonic() + 10
        while set(service.pids()) - idle and time.monotonic() < deadline:
            time.sleep(0.1)
        assert set(service.pids()) - idle == set(), "processes left after cancel"
    print(f"\ncancel of a running job took {took:.2f} s")
    assert took < 15


@pytest.fixture(scope="module")
def service_without_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with start_service(tmp_path_factory.mktemp("no-workers") / "data", workers=0) as running:
        yield running


def test_cancelling_a_queued_job_is_immediate_and_it_never_runs(service_without_workers: Service,
                                                                programs: dict[str, Path]) -> None:
    with service_without_workers.client() as client:
        job_id = submit(client, programs["relu_cos"], FAIL_ON_RELU)
        response = client.delete(f"/v1/jobs/{job_id}")
        assert response.status_code == 202 and response.json()["status"] == "cancelled"
        assert client.get("/healthz").json()["queues"]["cpu"] == 0
        assert [event.data["status"] for event in read_events(client, job_id)] == ["queued", "cancelled"]


def test_queued_jobs_survive_a_redis_crash_and_a_server_restart_and_a_server_stopped_mid_job_requeues_it(
        tmp_path: Path, programs: dict[str, Path]) -> None:
    """One data dir through three starts of the service, each restart part of the claim: queued
    jobs survive their Redis's SIGKILL (the server restarts it from the append-only file) and a
    server restart, and the second start's worker runs them; then stopping that server in the
    middle of a job leaves no process (`Service.stop` checks) and the job queued again with its
    attempt counted, as the third start shows."""
    data_dir = tmp_path / "data"
    # The jobs' phases after minimality (shrink, culprit: seconds of probes each) are not what is checked.
    fail_on_relu = {**FAIL_ON_RELU, "shrink": False, "culprit": False}
    with start_service(data_dir, workers=0) as first, first.client() as client:
        job_ids = [submit(client, programs["relu_cos"], fail_on_relu) for _ in range(3)]
        redis_pids = [pid for pid in first.pids()
                      if b"redis-server" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(redis_pids) == 1
        os.kill(redis_pids[0], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the server restarts its Redis from the append-only file
            health = client.get("/healthz")
            if health.status_code == 200 and health.json()["queues"]["cpu"] == 3:
                break
            time.sleep(0.2)
        assert health.json()["queues"]["cpu"] == 3, health.text
        assert {client.get(f"/v1/jobs/{job_id}").json()["status"] for job_id in job_ids} == {"queued"}
    with start_service(data_dir, workers=1) as second, second.client() as client:
        finals = [wait_for_status(client, job_id, FINISHED, timeout_s=180)["status"] for job_id in job_ids]
        assert finals == ["succeeded"] * 3
        wait_for_culprit(client, job_ids[-1])  # the worker is idle again: only the new job's processes count
        idle = set(second.pids())
        job_id = submit(client, programs["relu_cos"], HANG_ON_RELU)
        wait_for_status(client, job_id, {"running"})
        deadline = time.monotonic() + 60
        while len(set(second.pids()) - idle) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
    # leaving the block sent SIGTERM and checked that no process of that service is left
    with start_service(data_dir, workers=0) as third, third.client() as client:
        status = client.get(f"/v1/jobs/{job_id}").json()
        assert client.get("/healthz").json()["queues"]["cpu"] == 1
    assert status["status"] == "queued" and status["attempts"] == 1, status


def test_a_worker_from_another_machine_joins_with_redis_url_and_queues(service_without_workers: Service,
                                                                      programs: dict[str, Path]) -> None:
    env = {**os.environ, MARKER: service_without_workers.marker, **ALLOWED}
    worker = subprocess.Popen([sys.executable, "-m", "minify_worker.cli", "--redis-url",
                               service_without_workers.redis_url, "--queues", "cpu", "--name", "remote-1",
                               "--no-warm-up"],  # its job's backend is a test one: no inductor to warm up
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with service_without_workers.client() as client:
            # Which worker ran the job is the claim: the phases after minimality (shrink, culprit) are not.
            job_id = submit(client, programs["relu_cos"], {**FAIL_ON_RELU, "shrink": False, "culprit": False})
            final = wait_for_status(client, job_id, FINISHED, timeout_s=180)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
    assert final["status"] == "succeeded" and final["worker"] == "remote-1"


# The pause between two status reads while the twenty jobs run. The reads are the measurement, not
# the load (the jobs are), and the p99 must rest on several of them: the jobs now end within some
# 10 s, where every 0.1 s timed only 60-100 reads and the p99 was the single slowest (one 669 ms
# read on a loaded CI box failed the test). Every 20 ms times some 300-500, at 3.2 ms of CPU each
# (server 2.0, client 1.2; measured here).
STATUS_READ_S = 0.02


def test_twenty_concurrent_submissions_all_finish_and_status_stays_fast(service: Service,
                                                                       programs: dict[str, Path]) -> None:
    """Twenty jobs submitted at once, from as many clients, all run to their end on the module's
    service (its one worker busy throughout), and reading a job's status stays fast meanwhile. The
    count is a load, not the claim (it was fifty, on a service of its own with two workers)."""
    spec = {"backend": "eager"}  # the original passes: each job ends not_reproducible after reproducing
    with service.client() as client:
        job_ids: list[str] = []
        errors: list[str] = []

        def submit_one() -> None:
            with service.client() as own:
                try:
                    job_ids.append(submit(own, programs["chain"], spec))
                except AssertionError as error:
                    errors.append(str(error))

        threads = [threading.Thread(target=submit_one) for _ in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == [] and len(job_ids) == 20
        latencies: list[float] = []
        pending = set(job_ids)
        deadline = time.monotonic() + 900
        while pending and time.monotonic() < deadline:  # one status read every STATUS_READ_S, round robin
            for job_id in list(pending):
                started = time.perf_counter()
                status = client.get(f"/v1/jobs/{job_id}").json()["status"]
                latencies.append(time.perf_counter() - started)
                if status in FINISHED:
                    pending.discard(job_id)
                time.sleep(STATUS_READ_S)
        assert not pending, f"{len(pending)} jobs did not finish"
        statuses = {client.get(f"/v1/jobs/{job_id}").json()["status"] for job_id in job_ids}
    p50, p99 = statistics.median(latencies), percentile(latencies, 0.99)
    print(f"\nGET /v1/jobs/{{id}} while a worker ran 20 jobs: {len(latencies)} requests, "
          f"p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms")
    assert statuses == {"not_reproducible"}
    assert p99 < 0.5


def start_worker(service: Service, name: str, *flags: str, preload: bool = False) -> subprocess.Popen:
    """`minify-worker` on the cpu queue, in its own process group, as on a machine of its own.

    `preload` for a worker that runs a job: its torch imported once at start (seconds of CPU, tens
    on a loaded machine before it counts as live) instead of in each attempt's work horse, which
    without it also spawns a fork server that imports torch again. Without it for one that runs none:
    it starts in a second and never imports torch (`publish_config_schema`)."""
    env = {**os.environ, MARKER: service.marker, **ALLOWED}
    startup = ["--no-warm-up"] if preload else ["--no-preload"]  # its jobs' backends are test ones: no inductor
    return subprocess.Popen([sys.executable, "-m", "minify_worker.cli", "--redis-url", service.redis_url,
                             "--queues", "cpu", "--name", name, *startup, *flags],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def kill_whole_worker(worker: subprocess.Popen) -> None:
    """SIGKILL the worker and its work horse (which leads a process group of its own), as when its
    machine dies; the sandbox children follow by PR_SET_PDEATHSIG."""
    horses = children_of(worker.pid)
    os.killpg(worker.pid, signal.SIGKILL)
    for horse in horses:
        try:
            os.killpg(horse, signal.SIGKILL)
        except ProcessLookupError:
            pass
    worker.wait()


def stop_worker(worker: subprocess.Popen) -> None:
    """SIGTERM, as an operator stops a worker; one still running a minute on is killed, so that it
    does not count as live in the tests after, and the test fails."""
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            kill_whole_worker(worker)
            raise


def wait_for_live_workers(client: httpx.Client, count: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while (workers := client.get("/healthz").json()["workers"]) != count:
        assert time.monotonic() < deadline, f"{workers} live workers, not {count}, after {timeout_s:.0f} s"
        time.sleep(0.1)


# A preloaded worker's start (torch and inductor imported) on a loaded 2-core machine.
PRELOADED_START_S = 180


def test_a_job_whose_whole_worker_is_sigkilled_runs_again_on_an_idle_worker_within_seconds(
        service_without_workers: Service, programs: dict[str, Path]) -> None:
    """At the worst moment, too: in the middle of a maintenance pass, holding the queue's lock
    (here every second), which a dead worker would otherwise keep for MAINTENANCE_LOCK_S."""
    doomed = start_worker(service_without_workers, "doomed", *FAST_HEARTBEAT, preload=True)
    survivor: subprocess.Popen | None = None
    try:
        with service_without_workers.client() as client:
            wait_for_live_workers(client, 1, timeout_s=PRELOADED_START_S)
            job_id = submit(client, programs["relu_cos"], HANGS)
            assert wait_for_status(client, job_id, {"running"}, timeout_s=60)["worker"] == "doomed"
            survivor = start_worker(service_without_workers, "survivor", *FAST_HEARTBEAT, preload=True)
            wait_for_live_workers(client, 2, timeout_s=PRELOADED_START_S)
            redis = Redis.from_url(service_without_workers.redis_url)
            lock = MinifyQueue("cpu", connection=redis).registry_cleaning_key
            while not redis.set(lock, MinifyWorker.redis_worker_namespace_prefix + "doomed", ex=MAINTENANCE_LOCK_S,
                                nx=True):  # as doomed's acquire_maintenance_lock writes it: wait for a free one
                time.sleep(0.01)
            killed = time.monotonic()
            kill_whole_worker(doomed)
            deadline = killed + 60
            while (status := client.get(f"/v1/jobs/{job_id}").json())["attempts"] < 2:
                assert time.monotonic() < deadline, f"the job did not run again in 60 s: {status}"
                time.sleep(0.1)
            took = time.monotonic() - killed
            assert status["status"] == "running" and status["worker"] == "survivor", status
            client.delete(f"/v1/jobs/{job_id}")
            assert wait_for_status(client, job_id, FINISHED, timeout_s=30)["status"] == "cancelled"
            messages = [event.data.get("message", "") for event in read_events(client, job_id)]
    finally:
        if doomed.poll() is None:
            kill_whole_worker(doomed)
        if survivor is not None:
            stop_worker(survivor)
    print(f"\njob running again {took:.1f} s after its whole worker was SIGKILLed "
          f"(heartbeat interval 1 s, grace 2 s, maintenance every 1 s)")
    assert any("worker lost the job" in message and "re-queued" in message for message in messages), messages
    assert took < 15


def test_a_workers_log_shows_rqs_routine_maintenance_only_at_debug(service_without_workers: Service,
                                                                   tmp_path: Path) -> None:
    logs = {}
    for level in ("INFO", "DEBUG"):
        log_path = tmp_path / f"worker-{level}.log"
        with log_path.open("w") as log_file:
            worker = subprocess.Popen(
                [sys.executable, "-m", "minify_worker.cli", "--redis-url", service_without_workers.redis_url,
                 "--queues", "cpu", "--name", f"chatty-{level}", "--no-preload", "--log-level", level,
                 *FAST_HEARTBEAT], stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
            started = "cleaning" if level == "DEBUG" else "on queues"  # the first maintenance pass, or the start
            try:
                deadline = time.monotonic() + 60
                while started not in log_path.read_text():
                    assert worker.poll() is None and time.monotonic() < deadline, log_path.read_text()
                    time.sleep(0.2)
                time.sleep(3)  # three more maintenance passes
            finally:
                stop_worker(worker)
        logs[level] = log_path.read_text()
    assert "minify worker chatty-INFO on queues cpu" in logs["INFO"]
    assert "cleaning registries" not in logs["INFO"], logs["INFO"]
    assert "cleaning registries" in logs["DEBUG"]  # RQ still says it: the filter is what hides it

STOP_SWALLOWED_BY_A_LOG_WRITE = '''
import logging, os, signal, sys
from minify_worker.service.rqworker import main

class SignalledMidWrite:
    """A log stream into whose write the SIGTERM lands: RQ's handler raises StopRequested there, and
    logging's emit catches it (an Exception) as a failed write."""
    fired = False

    def write(self, text):
        if not self.fired and "Starting BLPOP" in text:  # idle, about to wait for a job
            self.fired = True
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100_000):  # the signal's Python handler runs at the next bytecode: here
                pass
        sys.stderr.write(text)

    def flush(self):
        sys.stderr.flush()

logging.basicConfig(level=logging.DEBUG, stream=SignalledMidWrite())
sys.exit(main(sys.argv[1:]))
'''


def test_a_stop_request_swallowed_where_it_landed_still_stops_an_idle_worker(service_without_workers: Service) -> None:
    """RQ stops an idle worker by raising StopRequested from its SIGTERM handler, wherever the main
    thread is; where that is inside a `try: ... except Exception` (logging's emit, at DEBUG often)
    the exception is swallowed and RQ's loop went on: the worker ran on after SIGTERM (seen in CI).
    The request itself is kept: the worker stops at its next beat."""
    worker = subprocess.run([sys.executable, "-c", STOP_SWALLOWED_BY_A_LOG_WRITE, "--redis-url",
                             service_without_workers.redis_url, "--queues", "cpu", "--name", "swallowed",
                             "--no-preload", *FAST_HEARTBEAT],
                            env={**os.environ, MARKER: service_without_workers.marker},
                            capture_output=True, text=True, timeout=30)
    assert "StopRequested" in worker.stderr  # where the signal landed: logging's emit reported it
    assert worker.returncode == 0, worker.stderr[-3000:]


def test_a_worker_without_preload_never_imports_torch_when_its_torch_is_described_already(
        service_without_workers: Service) -> None:
    """Describing torch's config settings (`publish_config_schema`) imports torch and its compiler's
    config, seconds of CPU, in a worker that otherwise never does; a preloaded worker describes it anew."""
    from minify_worker.service.rqworker import publish_config_schema

    publish_config_schema(Redis.from_url(service_without_workers.redis_url))  # as a worker of this torch did
    code = ("import sys; from minify_worker.service.rqworker import main; status = main(sys.argv[1:]); "
            "sys.exit(3 if 'torch' in sys.modules else status)")
    worker = subprocess.run([sys.executable, "-c", code, "--redis-url", service_without_workers.redis_url,
                             "--queues", "cpu", "--name", "torchless", "--no-preload", "--burst"],
                            env={**os.environ, MARKER: service_without_workers.marker}, capture_output=True,
                            text=True, timeout=120)
    assert worker.returncode == 0, worker.stderr[-2000:]
    assert "config settings are described already" in worker.stderr


def test_healthz_and_metrics_count_only_live_workers(service_without_workers: Service) -> None:
    worker = start_worker(service_without_workers, "short-lived", *FAST_HEARTBEAT)
    try:
        with service_without_workers.client() as client:
            wait_for_live_workers(client, 1)
            assert "minify_workers 1.0" in client.get("/metrics").text
            kill_whole_worker(worker)
            wait_for_live_workers(client, 0, timeout_s=10)  # its heartbeat (1 + 2 s) expired
            health = client.get("/healthz").json()
            text = client.get("/metrics").text
    finally:
        if worker.poll() is None:
            kill_whole_worker(worker)
    assert health["status"] == "degraded" and health["workers"] == 0
    assert "minify_workers 0.0" in text


def test_a_cuda_job_with_no_cuda_worker_says_so_at_submit_and_on_its_status(
        service_without_workers: Service, programs: dict[str, Path]) -> None:
    program = programs["relu_cos"]
    with service_without_workers.client() as client:
        created = client.post("/v1/jobs", files={"program": (program.name, program.read_bytes())},
                              data={"spec": json.dumps({"backend": "eager", "device": "cuda"})})
        assert created.status_code == 201, created.text
        status = client.get(f"/v1/jobs/{created.json()['id']}").json()
        client.delete(f"/v1/jobs/{created.json()['id']}")
    assert created.json()["warnings"] == ["no worker is serving the cuda queue; the job waits until one starts"]
    assert status["status"] == "queued"
    assert len(status["warnings"]) == 1, status
    assert status["warnings"][0].startswith("no worker has served the cuda queue for ")

