"""The service at CI scale (issue 22): many clients posting the same few failing programs.

    python bench/bugs.py [--clients 10] [--rounds 10] [--workers 2]

Starts a real minify-server (embedded Redis, local workers) in a temporary data dir, writes twenty
tiny programs that make five bugs under `tests.support.backends:fail_on_each_of_five` (four per
failing op, each with other ops around it and another input size), and posts every program
`--rounds` times, the submissions dealt out to `--clients` concurrent clients (`run_load`). Every
API request's latency is recorded while the jobs run; then every job's end and the bug list are
checked. tests/server/test_bugs.py runs the same function; docs/service.md has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

SPEC = {"backend": "tests.support.backends:fail_on_each_of_five", "failure": {"kind": "compile_error"},
        "culprit": False, "shrink": False}
FINISHED = {"succeeded", "not_reproducible", "failed", "cancelled"}
# How often a client asks about each of its jobs that has not ended, as `minify-client` polling would.
POLL_S = 0.5


@dataclass
class LoadResult:
    submissions: int = 0
    created: int = 0
    deduplicated: int = 0
    statuses: dict[str, str] = field(default_factory=dict)  # job id -> final status
    lost: list[str] = field(default_factory=list)  # job ids a submission got that never ended or vanished
    errors: list[str] = field(default_factory=list)
    bug_counts: dict[str, int] = field(default_factory=dict)  # signature -> jobs
    latencies_s: list[float] = field(default_factory=list)
    post_latencies_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def p50_s(self) -> float:
        return percentile(self.latencies_s, 0.5)

    @property
    def p99_s(self) -> float:
        return percentile(self.latencies_s, 0.99)

    def summary(self) -> str:
        return (f"{self.submissions} submissions: {self.created} jobs created, {self.deduplicated} deduplicated; "
                f"{sum(status == 'succeeded' for status in self.statuses.values())} succeeded, "
                f"{len(self.lost)} lost, {len(self.errors)} errors; {len(self.bug_counts)} bugs "
                f"({', '.join(str(count) for count in sorted(self.bug_counts.values()))} jobs); "
                f"{len(self.latencies_s)} API requests during the run: p50 {self.p50_s * 1000:.1f} ms, "
                f"p99 {self.p99_s * 1000:.1f} ms, max {max(self.latencies_s, default=0) * 1000:.1f} ms "
                f"(POST /v1/jobs: p50 {percentile(self.post_latencies_s, 0.5) * 1000:.1f} ms, "
                f"p99 {percentile(self.post_latencies_s, 0.99) * 1000:.1f} ms); "
                f"{self.wall_s:.1f} s from the first submission to the last job's end")


def percentile(samples: list[float], fraction: float) -> float:
    """The sample at `fraction` of the sorted samples (0.99: the p99), 0 for none."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def run_load(url: str, programs: dict[str, list[Path]], *, clients: int = 10, rounds: int = 10,
             headers: dict[str, str] | None = None, timeout_s: float = 300.0) -> LoadResult:
    """Post every program `rounds` times, the submissions shuffled and dealt round-robin to `clients`
    threads; each thread then polls the jobs it was answered with until they end. Every request
    is timed. A job is lost when its id answers 404 or it has not ended after `timeout_s`.
    """
    paths = [path for group in programs.values() for path in group]
    submissions = [path for _ in range(rounds) for path in paths]
    random.Random(22).shuffle(submissions)
    shares = [submissions[index::clients] for index in range(clients)]
    result = LoadResult(submissions=len(submissions))
    lock = threading.Lock()
    answers: list[tuple[str, int]] = []

    def timed(call: Callable[..., httpx.Response], *args: object, **kwargs: object) -> httpx.Response:
        started = time.perf_counter()
        response = call(*args, **kwargs)
        with lock:
            result.latencies_s.append(time.perf_counter() - started)
            if call.__name__ == "post":
                result.post_latencies_s.append(result.latencies_s[-1])
        return response

    def client_work(share: list[Path]) -> None:
        with httpx.Client(base_url=url, headers=headers or {}, timeout=60) as client:
            mine: set[str] = set()
            for path in share:
                body = path.read_bytes()
                response = timed(client.post, "/v1/jobs", files={"program": (path.name, body)},
                                 data={"spec": json.dumps(SPEC)})
                if response.status_code not in (200, 201):
                    with lock:
                        result.errors.append(f"POST {path.name}: {response.status_code} {response.text[:200]}")
                    continue
                job_id = response.json()["id"]
                mine.add(job_id)
                with lock:
                    answers.append((job_id, response.status_code))
            deadline = time.monotonic() + timeout_s
            while mine and time.monotonic() < deadline:
                for job_id in sorted(mine):
                    response = timed(client.get, f"/v1/jobs/{job_id}")
                    status = response.json().get("status") if response.status_code == 200 else None
                    if response.status_code == 404:
                        with lock:
                            result.lost.append(job_id)
                        mine.discard(job_id)
                    elif status in FINISHED:
                        with lock:
                            result.statuses[job_id] = status
                        mine.discard(job_id)
                time.sleep(POLL_S)
            with lock:
                result.lost.extend(mine)

    started = time.monotonic()
    threads = [threading.Thread(target=client_work, args=(share,)) for share in shares]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result.wall_s = time.monotonic() - started
    result.created = sum(code == 201 for _, code in answers)
    result.deduplicated = sum(code == 200 for _, code in answers)
    with httpx.Client(base_url=url, headers=headers or {}, timeout=60) as client:
        bugs = client.get("/v1/bugs", params={"limit": 500}).json()["bugs"]
    result.bug_counts = {bug["signature"]: bug["count"] for bug in bugs}
    result.lost = sorted(set(result.lost))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10, help="times each of the 20 programs is posted")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    repo = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(repo))
    # The workers' sandbox children import the test backends by path, from the repo root.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))
    from tests.server.test_bugs import build_programs
    from tests.support.service import start_service

    with tempfile.TemporaryDirectory(prefix="minify-bench-bugs-") as scratch:
        programs = build_programs(Path(scratch) / "programs")
        with start_service(Path(scratch) / "data", workers=args.workers) as service:
            result = run_load(service.url, programs, clients=args.clients, rounds=args.rounds)
    print(result.summary())
    return 0 if not result.lost and not result.errors else 1


if __name__ == "__main__":
    sys.exit(main())
