"""`minify-worker --redis-url URL --queues cpu,cuda`: an RQ worker for the minify queues.

The worker process never touches CUDA or a tensor: RQ forks a work horse per job and only the
horse (minify_worker.job.run_job → the engine) runs anything. Unless --no-preload, the worker
does import the engine, torch and inductor once at start and runs inductor's CPU warm-up
(`minify_worker.sandbox.preload`: no CUDA, no kernel run, no thread), so that each horse's sandbox
forks its fork server from that warm state instead of importing and warming up per job (seconds).
Run one per machine (one per GPU), pointed at the service's Redis; as many machines as you like.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import time
from types import FrameType

from redis import Redis
from rq import Queue, Worker
from rq.job import Job

from minify_worker.job import record_worker_lost
from minify_worker.workdirs import remove_stale_job_dirs

log = logging.getLogger(__name__)

QUEUE_NAMES = ("cpu", "cuda")
# How long a job may take to stop (cancel its candidates, write its status) on a cold shutdown.
HORSE_STOP_GRACE_S = 10.0


class MinifyWorker(Worker):
    """An RQ worker whose cold shutdown lets the running job stop its candidates and be re-queued."""

    def request_force_stop(self, signum: int, frame: FrameType | None) -> None:
        if self.horse_pid:
            os.kill(self.horse_pid, signal.SIGTERM)  # run_job turns this into the engine's cancel
            deadline = time.monotonic() + HORSE_STOP_GRACE_S
            while time.monotonic() < deadline and _alive(self.horse_pid):
                time.sleep(0.1)
        super().request_force_stop(signum, frame)


def _alive(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    if waited:
        return False
    return True


def _horse_killed(job: Job, retpid: int, ret_val: int, rusage: object) -> None:
    why = (f"work horse killed by {signal.Signals(os.WTERMSIG(ret_val)).name}" if os.WIFSIGNALED(ret_val)
           else f"work horse exited with status {os.WEXITSTATUS(ret_val)}")
    record_worker_lost(job.connection, job, why)
    remove_stale_job_dirs()  # the horse could not remove its job folder


def default_queues() -> str:
    """cpu, plus cuda when this machine has an NVIDIA GPU (seen without importing torch)."""
    has_gpu = os.path.exists("/dev/nvidia0") or os.path.exists("/proc/driver/nvidia/gpus")
    return "cpu,cuda" if has_gpu else "cpu"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minify-worker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", default=os.environ.get("MINIFY_REDIS_URL"),
                        help="the service's Redis (env MINIFY_REDIS_URL), e.g. redis://host:6379/0")
    parser.add_argument("--queues", default=os.environ.get("MINIFY_QUEUES") or default_queues(),
                        help="comma-separated: cpu, cuda (default: cpu, plus cuda on a GPU machine)")
    parser.add_argument("--name", help="worker name shown in job records (default: host-pid)")
    parser.add_argument("--allowed-backends", default=None,
                        help="custom backend module prefixes jobs may import (env MINIFY_ALLOWED_BACKENDS)")
    parser.add_argument("--burst", action="store_true", help="exit when the queues are empty")
    parser.add_argument("--maintenance-interval", type=int, default=30,
                        help="seconds between RQ registry cleanups (re-queues jobs of dead workers)")
    parser.add_argument("--no-preload", dest="preload", action="store_false",
                        help="do not import the engine (torch) in the worker; each job imports it")
    parser.add_argument("--log-level", default="INFO")
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.redis_url:
        parser.error("--redis-url is required (or set MINIFY_REDIS_URL)")
    queues = [name.strip() for name in args.queues.split(",") if name.strip()]
    unknown = [name for name in queues if name not in QUEUE_NAMES]
    if unknown or not queues:
        parser.error(f"--queues must name some of {', '.join(QUEUE_NAMES)}; got {args.queues!r}")
    if args.allowed_backends is not None:
        os.environ["MINIFY_ALLOWED_BACKENDS"] = args.allowed_backends
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.preload:
        # Inherited by every forked work horse, whose sandbox then forks its fork server from it.
        import minify_worker.engine  # noqa: F401
        from minify_worker.sandbox import preload

        log.info("preloaded torch and inductor: %s", preload())
    remove_stale_job_dirs()  # left by work horses of an earlier worker that was killed
    redis = Redis.from_url(args.redis_url)
    worker = MinifyWorker(
        [Queue(name, connection=redis) for name in queues],
        connection=redis,
        name=args.name or f"{socket.gethostname()}-{os.getpid()}",
        work_horse_killed_handler=_horse_killed,
        maintenance_interval=args.maintenance_interval,
    )
    log.info("minify worker %s on queues %s", worker.name, ", ".join(queues))
    worker.work(burst=args.burst, logging_level=args.log_level)
    return 0
