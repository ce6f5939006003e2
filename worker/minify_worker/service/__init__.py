"""The worker as a service: the RQ entries and what they keep in Redis (docs/service.md).

- `job`: `run_job`, one attempt of a job: the engine run, the job's record and event stream.
- `channel`: a job's Redis channel (record, events, counters), fenced by attempt.
- `rqworker`: the RQ worker process (`minify-worker --redis-url ...`), its heartbeat and re-queues.
- `joblog`: a job's own log beside its artifacts.
- `versions`: the version phase, re-tests and bisections across torch installations.
"""
