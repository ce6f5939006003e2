"""`minify-worker --redis-url URL --queues cpu,cuda`: an RQ worker for the minify queues.

The worker process never touches CUDA or a tensor: RQ forks a work horse per job and only the
horse (minify_worker.service.job.run_job → the engine) runs anything. Unless --no-preload, the worker
does import the engine, torch and inductor once at start and runs inductor's CPU warm-up
(`minify_worker.sandbox.preload`: no CUDA, no kernel run, no thread), so that each horse's sandbox
forks its fork server from that warm state instead of importing and warming up per job (seconds).
Run one per machine (one per GPU), pointed at the service's Redis; as many machines as you like.

Liveness: the worker heartbeats every --heartbeat-interval seconds, idle or busy; its record and
its running job's entry expire --heartbeat-grace seconds after a missed beat. Every worker, idle
or busy, runs RQ's maintenance every --maintenance-interval seconds, which re-queues the jobs of
workers whose heartbeat expired. So a worker that dies whole (machine lost, SIGKILL) has its job
running again within interval + grace + maintenance seconds, whatever the other workers do.

Redis outages: a worker, idle or busy, rides them out. Its Redis calls fail, are logged once, and
are tried again on the next beat (busy: the job goes on, its writes wait, minify_worker.service.job) or
after a backoff of up to REDIS_BACKOFF_MAX_S (idle); nothing of RQ's loop quits on them. Should the
loop end anyway (Redis down at start, a fault RQ does not survive), `main` starts the worker again,
backing off, until it is asked to stop (docs/deploy.md, "Faults between machines").
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import socket
import sys
import threading
import time
from types import FrameType

from redis import Redis
from redis.exceptions import RedisError
from rq import Queue, Worker, worker_registration
from rq.exceptions import StopRequested
from rq.executions import Execution
from rq.job import Job
from rq.worker import WorkerStatus

from minify_contract.config_schema import describe_torch_config
from minify_contract.ledger import CONFIG_SCHEMAS_KEY, QUEUES_SERVED_KEY
from minify_worker.engine.workdirs import remove_stale_job_dirs
from minify_worker.sandbox.limits import PARALLELISM_ENV, parallelism_of
from minify_worker.service.channel import REDIS_PATIENCE_ENV, redis_patience_s
from minify_worker.service.job import record_worker_lost
from minify_worker.service.versions import phase as versions_phase
from minify_worker.service.versions.bisect import BISECT_QUEUE
from minify_worker.service.versions.envs import IndexInstaller, own_env

log = logging.getLogger(__name__)

QUEUE_NAMES = ("cpu", "cuda")
# How long a job may take to stop (cancel its candidates, write its status) on a cold shutdown.
HORSE_STOP_GRACE_S = 10.0
HEARTBEAT_INTERVAL_S = 10
HEARTBEAT_GRACE_S = 30
MAINTENANCE_INTERVAL_S = 15
# RQ holds a queue's maintenance lock for 899 s: a worker killed while cleaning would stop every
# other worker's cleaning, and so the recovery of lost jobs, for 15 minutes. Ours lasts a minute,
# and names its holder: a lock whose holder's worker record has expired is taken over at once.
MAINTENANCE_LOCK_S = 60
# Take the lock over if its holder (a worker's Redis key) has no record any more: KEYS[1] the lock,
# ARGV[1] the new holder, ARGV[2] the lock's lifetime, ARGV[3] the prefix of workers' keys.
_TAKE_OVER_A_DEAD_HOLDERS_LOCK = """
local holder = redis.call('GET', KEYS[1])
if holder and string.sub(holder, 1, #ARGV[3]) == ARGV[3] and redis.call('EXISTS', holder) == 0 then
    redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
    return 1
end
return 0
"""
_PR_SET_PDEATHSIG = 1
# An idle worker tries Redis again after at most this long (RQ's own backoff reaches 60 s).
REDIS_BACKOFF_MAX_S = 4.0
# `main` starts the worker loop again after a fault, after this long (doubling to the max).
RESTART_FIRST_S = 1.0
RESTART_MAX_S = 30.0


class _RoutineMaintenanceAtDebug(logging.Filter):
    """RQ says "cleaning registries" at INFO on every maintenance pass, per queue: here every 15 s,
    most of a worker's log. Routine: those lines show at DEBUG only."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.INFO and "cleaning" in str(record.msg) and "registries" in str(record.msg):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger("rq.worker").isEnabledFor(logging.DEBUG)
        return True


class MinifyQueue(Queue):
    """A queue whose maintenance lock says which worker holds it (`holder`, that worker's Redis key)."""

    holder = ""

    def acquire_maintenance_lock(self) -> bool:
        """Free, or held by a worker whose record expired (killed in the middle of a pass: it
        heartbeats every interval, so its record outlives it by the grace): this worker takes it.
        Otherwise the lost jobs of the dead worker would wait for the lock to run out."""
        key, holder = self.registry_cleaning_key, self.holder or "1"
        if self.connection.set(key, holder, nx=True, ex=MAINTENANCE_LOCK_S):
            return True
        return self.holder != "" and bool(
            self.connection.eval(_TAKE_OVER_A_DEAD_HOLDERS_LOCK, 1, key, holder, MAINTENANCE_LOCK_S,
                                 Worker.redis_worker_namespace_prefix))


class MinifyWorker(Worker):
    """An RQ worker that heartbeats and cleans up on a short period, idle or busy, and whose cold
    shutdown lets the running job stop its candidates and be re-queued.

    RQ itself blocks an idle worker in one dequeue for worker_ttl - 15 s (405 s by default),
    runs maintenance only between dequeues and never while a job runs, and keeps a dead worker's
    record for worker_ttl + 60 s.
    """

    def __init__(self, *args: object, heartbeat_interval_s: int = HEARTBEAT_INTERVAL_S,
                 heartbeat_grace_s: int = HEARTBEAT_GRACE_S, **kwargs: object) -> None:
        self.heartbeat_interval_s = heartbeat_interval_s
        self.heartbeat_grace_s = heartbeat_grace_s
        self._parent_pid = os.getpid()
        self._unreachable_since: float | None = None
        super().__init__(*args, job_monitoring_interval=heartbeat_interval_s,
                         worker_ttl=heartbeat_interval_s + heartbeat_grace_s, **kwargs)
        self.max_connection_wait_time = REDIS_BACKOFF_MAX_S

    @property
    def stop_requested(self) -> bool:
        """A signal asked the worker to stop (RQ's warm shutdown, idle or busy)."""
        return self._stop_requested or self._shutdown_requested_date is not None

    def _unreachable(self, error: RedisError) -> None:
        """A Redis call failed: said once per outage; the caller goes on."""
        if self._unreachable_since is None:
            self._unreachable_since = time.monotonic()
            log.warning("worker %s: Redis unreachable (%s); riding it out", self.name, error)

    def _reachable(self) -> None:
        if self._unreachable_since is not None:
            log.warning("worker %s: Redis answers again after %.1f s", self.name,
                        time.monotonic() - self._unreachable_since)
            self._unreachable_since = None

    def _stop_if_asked(self) -> None:
        """RQ stops an idle worker by raising StopRequested from its signal handler, wherever the main
        thread is: inside a `try: ... except Exception` (logging's emit, much of the time at DEBUG)
        it is swallowed, and RQ's loop went on with the worker running after SIGTERM. The request
        itself is kept: raised again here, at the loop's next turn or beat, while no job runs."""
        if self.stop_requested and self.get_state() != WorkerStatus.BUSY:
            raise StopRequested()

    def check_for_suspension(self, burst: bool) -> None:
        self._stop_if_asked()
        try:
            super().check_for_suspension(burst)
        except RedisError as error:
            self._unreachable(error)
            time.sleep(REDIS_BACKOFF_MAX_S)

    def run_maintenance_tasks(self) -> None:
        try:
            super().run_maintenance_tasks()
        except RedisError as error:  # the next beat tries again
            self._unreachable(error)

    def set_state(self, state: str, pipeline: object | None = None) -> None:
        if pipeline is not None:
            super().set_state(state, pipeline=pipeline)
            return
        try:
            super().set_state(state)
        except RedisError as error:  # the next beat writes the record again
            self._unreachable(error)

    def execute_job(self, job: Job, queue: Queue) -> None:
        """RQ's, except that a Redis fault in its bookkeeping (before the fork, or after the horse
        ended) leaves the worker at work: the attempt's own writes are fenced, and one that was lost
        unrecorded is re-queued by maintenance once its execution's heartbeat expires."""
        try:
            super().execute_job(job, queue)
        except RedisError as error:
            self._unreachable(error)
            log.warning("worker %s: Redis failed around job %s (%s); back to the queue", self.name, job.id, error)

    @property
    def dequeue_timeout(self) -> int:
        return self.heartbeat_interval_s

    def heartbeat(self, timeout: int | None = None, pipeline: object | None = None) -> None:
        """Extend this worker's record, and say when its queues were last served (the server tells
        the submitter of a job nobody serves since when). A record that expired meanwhile (Redis
        unreachable past the grace, or restarted without it) is written whole again."""
        if pipeline is not None:
            self._beat(pipeline)
            return
        self._stop_if_asked()
        try:
            if self.birth_date is not None and not self.connection.hexists(self.key, "birth"):
                self._register_again()
            self._beat(self.connection)
        except RedisError as error:
            self._unreachable(error)
            return
        self._reachable()

    def _beat(self, connection: object) -> None:
        super().heartbeat(self.heartbeat_interval_s + self.heartbeat_grace_s, pipeline=connection)
        connection.hset(QUEUES_SERVED_KEY, mapping={name: int(time.time()) for name in self.queue_names()})
        versions_phase.announce(connection, self.name, versions_phase.offered_envs())

    def _register_again(self) -> None:
        """This worker's record and its place in RQ's worker sets, as at its start: maintenance
        dropped them when the record expired."""
        with self.connection.pipeline() as pipe:
            pipe.hset(self.key, mapping=self.serialize())
            worker_registration.register(self, pipe)
            pipe.expire(self.key, self.heartbeat_interval_s + self.heartbeat_grace_s)
            pipe.execute()
        log.warning("worker %s: its record had expired; registered again", self.name)

    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        """How long the running job's entry lives without a beat (RQ adds a fixed 60 s)."""
        interval = float(self.heartbeat_interval_s)
        if job.timeout and job.timeout > 0:
            interval = min(job.timeout - working_time, interval)
        return int(interval) + self.heartbeat_grace_s

    def maintain_heartbeats(self, job: Job, execution: Execution) -> None:
        """Every heartbeat interval while a job runs: beat, and clean up when it is time. Redis
        unreachable: the job goes on (its writes wait, minify_worker.service.job); the next beat tries again."""
        try:
            if self.birth_date is not None and not self.connection.hexists(self.key, "birth"):
                self._register_again()
            super().maintain_heartbeats(job, execution)
        except RedisError as error:
            self._unreachable(error)
            return
        self._reachable()
        if self.should_run_maintenance_tasks:
            self.run_maintenance_tasks()

    def main_work_horse(self, job: Job, queue: Queue) -> None:
        # A horse outliving its worker would run on unwatched while its job is re-queued elsewhere:
        # SIGTERM stops the job as a cold shutdown does, and it is re-queued at once.
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != self._parent_pid:  # the worker died before the prctl
            os._exit(1)
        super().main_work_horse(job, queue)

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


def publish_config_schema(redis: Redis) -> None:
    """Say which JobSpec.config settings this worker's torch takes: the server checks specs against it.

    A worker that did not preload leaves a description of its torch version that is there already as
    it is: describing imports torch and its compiler's config modules (some 5 s of CPU, tens of
    seconds on a loaded machine) in a process that otherwise never imports torch, to write what
    another worker of that torch wrote. A preloaded worker has torch imported and describes it anew."""
    if "torch" not in sys.modules:
        version = own_env().torch  # read without importing torch
        if redis.hexists(CONFIG_SCHEMAS_KEY, version):
            log.info("torch %s's config settings are described already: not imported to describe them", version)
            return
    try:
        schema = describe_torch_config()
    except Exception as error:  # a torch whose config modules differ: the server checks nothing for it
        log.warning("cannot describe torch's config settings for the server's checks: %s", error)
        return
    redis.hset(CONFIG_SCHEMAS_KEY, schema.torch, schema.model_dump_json())


def default_queues() -> str:
    """cpu, plus cuda when this machine has an NVIDIA GPU (seen without importing torch)."""
    has_gpu = os.path.exists("/dev/nvidia0") or os.path.exists("/proc/driver/nvidia/gpus")
    return "cpu,cuda" if has_gpu else "cpu"


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


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
    parser.add_argument("--heartbeat-interval", type=int, metavar="SECONDS",
                        default=_env_int("MINIFY_HEARTBEAT_INTERVAL", HEARTBEAT_INTERVAL_S),
                        help=f"seconds between heartbeats (env MINIFY_HEARTBEAT_INTERVAL; default "
                             f"{HEARTBEAT_INTERVAL_S})")
    parser.add_argument("--heartbeat-grace", type=int, metavar="SECONDS",
                        default=_env_int("MINIFY_HEARTBEAT_GRACE", HEARTBEAT_GRACE_S),
                        help=f"a worker silent this long after a missed heartbeat is dead and its job is "
                             f"re-queued (env MINIFY_HEARTBEAT_GRACE; default {HEARTBEAT_GRACE_S})")
    parser.add_argument("--maintenance-interval", type=int, metavar="SECONDS",
                        default=_env_int("MINIFY_MAINTENANCE_INTERVAL", MAINTENANCE_INTERVAL_S),
                        help="seconds between RQ registry cleanups, which re-queue the jobs of dead workers "
                             f"(env MINIFY_MAINTENANCE_INTERVAL; default {MAINTENANCE_INTERVAL_S})")
    parser.add_argument("--redis-patience", type=float, metavar="SECONDS", default=redis_patience_s(),
                        help="how long a running job rides out Redis unreachable (its events wait, its final "
                             "writes are retried) before it gives its attempt up (env MINIFY_REDIS_PATIENCE_S; "
                             "default %(default)g)")
    parser.add_argument("--no-preload", dest="preload", action="store_false",
                        help="do not import the engine (torch) in the worker; each job imports it")
    parser.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                        default=os.environ.get("MINIFY_WORKER_WARM_UP", "1") != "0",
                        help="preload without inductor's CPU warm-up (its ISA probe and a compile, ~2 s of CPU at "
                             "start): for workers that run other backends; an inductor job then warms up its own "
                             "fork server (env MINIFY_WORKER_WARM_UP=0)")
    parser.add_argument("--parallelism", metavar="N", default=os.environ.get(PARALLELISM_ENV),
                        help="candidates in flight at once for a job that sets no parallelism of its own (env "
                             f"{PARALLELISM_ENV}; default: one per core on CPU, up to 4 per GPU); lower it when "
                             "several workers, or other work, share this machine's cores")
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
    for flag in ("heartbeat_interval", "heartbeat_grace", "maintenance_interval"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1 second")
    if args.allowed_backends is not None:
        os.environ["MINIFY_ALLOWED_BACKENDS"] = args.allowed_backends
    if args.parallelism is not None and args.parallelism.strip():
        try:
            parallelism = parallelism_of(args.parallelism, f"--parallelism (or {PARALLELISM_ENV})")
        except ValueError as error:
            parser.error(str(error))
        os.environ[PARALLELISM_ENV] = str(parallelism)  # the work horses' jobs read it
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.preload:
        # Inherited by every forked work horse, whose sandbox then forks its fork server from it.
        import minify_worker.engine  # noqa: F401
        from minify_worker.sandbox import preload

        log.info("preloaded torch and inductor: %s", preload(warm=args.warm_up))
    remove_stale_job_dirs()  # left by work horses of an earlier worker that was killed
    os.environ[REDIS_PATIENCE_ENV] = str(args.redis_patience)  # the work horses read it
    redis = Redis.from_url(args.redis_url)
    name = args.name or f"{socket.gethostname()}-{os.getpid()}"
    # The version phase's probes: a queue per torch installation this worker holds (minify_worker/service/versions).
    queues += [versions_phase.queue_name(env.torch) for env in versions_phase.offered_envs()]
    if IndexInstaller.from_environ(os.environ) is not None:  # it can install releases: it bisects
        queues.append(BISECT_QUEUE)
    logging.getLogger("rq.worker").addFilter(_RoutineMaintenanceAtDebug())
    pause = RESTART_FIRST_S
    while True:
        worker: MinifyWorker | None = None
        try:
            publish_config_schema(redis)
            worker = _worker(redis, name, queues, args)
            log.info("minify worker %s on queues %s", worker.name, ", ".join(queues))
            worker.work(burst=args.burst, logging_level=args.log_level)
        except (RedisError, ValueError) as error:  # Redis down at start; our name still held by our last record
            log.warning("worker %s could not run: %s", name, error)
        if args.burst or (worker is not None and worker.stop_requested):
            return 0
        log.warning("worker %s: its loop ended without a stop request; starting it again in %.0f s", name, pause)
        if _stopped_while_waiting(pause):
            return 0
        pause = min(pause * 2, RESTART_MAX_S)


def _stopped_while_waiting(seconds: float) -> bool:
    """Wait `seconds` between two runs of the worker loop; True if SIGTERM or SIGINT came meanwhile
    (RQ's own handlers, which ask the worker to stop, are installed again by its next run)."""
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda received, frame: stop.set())
    return stop.wait(seconds)


def _worker(redis: Redis, name: str, queues: list[str], args: argparse.Namespace) -> MinifyWorker:
    served = [MinifyQueue(queue, connection=redis) for queue in queues]
    for queue in served:
        queue.holder = MinifyWorker.redis_worker_namespace_prefix + name
    return MinifyWorker(
        served,
        connection=redis,
        name=name,
        work_horse_killed_handler=_horse_killed,
        maintenance_interval=args.maintenance_interval,
        heartbeat_interval_s=args.heartbeat_interval,
        heartbeat_grace_s=args.heartbeat_grace,
    )
