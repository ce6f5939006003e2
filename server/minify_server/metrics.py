"""`/metrics`: Prometheus text built at scrape time from the job records and the Redis counters."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from minify_contract.models import JobState


class _Snapshot:
    """A one-shot collector over values already read from Redis."""

    def __init__(self, statuses: list[str], depths: dict[str, int], workers: int,
                 counters: dict[str, int], bugs: int, data_bytes: int, torch_versions: dict[str, int]) -> None:
        self.statuses = Counter(statuses)
        self.depths = depths
        self.workers = workers
        self.counters = counters
        self.bugs = bugs
        self.data_bytes = data_bytes
        self.torch_versions = torch_versions

    def collect(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily("minify_jobs", "Jobs by status", labels=["status"])
        for state in JobState:
            jobs.add_metric([state.value], self.statuses.get(state.value, 0))
        yield jobs
        depth = GaugeMetricFamily("minify_queue_depth", "Jobs waiting per queue", labels=["queue"])
        for name, count in self.depths.items():
            depth.add_metric([name], count)
        yield depth
        yield GaugeMetricFamily("minify_workers", "Live workers (heartbeat not expired)", value=self.workers)
        held = GaugeMetricFamily("minify_worker_torch_versions", "Live workers holding each torch version (the "
                                 "version phase runs repro.py on every one)", labels=["torch"])
        for version, count in self.torch_versions.items():
            held.add_metric([version], count)
        yield held
        yield GaugeMetricFamily("minify_bugs", "Bugs listed (succeeded jobs grouped by signature and graph shape)",
                                value=self.bugs)
        yield GaugeMetricFamily("minify_data_dir_bytes", "Bytes of every file in the data dir (uploads, results, "
                                "embedded Redis)", value=self.data_bytes)
        yield CounterMetricFamily("minify_checks", "Candidate checks run by finished jobs",
                                  value=self.counters.get("checks_total", 0))
        yield CounterMetricFamily("minify_checks_cached", "Candidate checks answered from the memo",
                                  value=self.counters.get("checks_cached", 0))
        outcomes = CounterMetricFamily("minify_candidate_outcomes", "Candidate outcomes by kind",
                                       labels=["kind"])
        for name, count in sorted(self.counters.items()):
            if name.startswith("outcome:"):
                outcomes.add_metric([name.removeprefix("outcome:")], count)
        yield outcomes


def render(statuses: list[str], depths: dict[str, int], workers: int, counters: dict[str, int],
           bugs: int, data_bytes: int, torch_versions: dict[str, int] | None = None) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(statuses, depths, workers, counters, bugs, data_bytes, torch_versions or {}))
    return generate_latest(registry)
