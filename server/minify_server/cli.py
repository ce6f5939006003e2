"""`minify-server`: the API and dashboard; without --redis-url also an embedded Redis and local workers."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from pathlib import Path

import uvicorn
from pydantic import ValidationError

from minify_server.app import create_app
from minify_server.config import BindingError, Settings, check_binding
from minify_server.embedded import EmbeddedRedis, LocalWorker, local_worker_queues

log = logging.getLogger("minify_server")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minify-server",
        description="The minify API and dashboard. Every flag has a MINIFY_<NAME> environment variable.")
    parser.add_argument("--redis-url", help="a shared Redis; without it an embedded one runs in the data dir")
    parser.add_argument("--data-dir", type=Path, help="uploads, results, embedded Redis (default ./minify-data)")
    parser.add_argument("--host", help="listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="listen port (default 8000)")
    parser.add_argument("--upload-limit", type=int, dest="upload_limit_bytes", metavar="BYTES",
                        help="largest upload (default 2 GiB)")
    parser.add_argument("--tokens", help="comma-separated bearer tokens (default: MINIFY_TOKENS; none: no auth)")
    parser.add_argument("--allowed-backends", help="custom backend module prefixes, passed to local workers")
    parser.add_argument("--allow-pickle", action="store_true", default=None,
                        help="accept torch.save'd GraphModules (unpickled in sandbox children only)")
    parser.add_argument("--workers", type=int, help="local workers in embedded mode (default 1)")
    parser.add_argument("--worker-queues", help="queues of the local workers (default cpu, +cuda on a GPU)")
    parser.add_argument("--retention-days", type=float,
                        help="delete jobs that ended longer ago, and their uploads and results (default 30)")
    parser.add_argument("--insecure-no-auth", action="store_true", default=None,
                        help="allow --host beyond loopback without tokens")
    parser.add_argument("--log-level", default="info")
    return parser


def settings_from_args(args: argparse.Namespace) -> Settings:
    overrides = {name: value for name, value in vars(args).items() if value is not None and name != "log_level"}
    return Settings(**overrides)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        settings = settings_from_args(args)
        check_binding(settings)
    except (ValidationError, BindingError) as error:
        print(f"minify-server: {error}", file=sys.stderr)
        return 2
    settings.data_dir = settings.data_dir.resolve()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    # The port is taken before Redis and the workers start: a busy one ends the server here, at once.
    try:
        listener = bind_listener(settings.host, settings.port)
    except OSError as error:
        print(f"minify-server: cannot listen on {settings.host}:{settings.port}: "
              f"{os.strerror(error.errno) if error.errno else error}. "
              "Another process may hold the port: pick another with --port N (or MINIFY_PORT=N; "
              "`make serve PORT=N`)", file=sys.stderr)
        return 2
    # SIGTERM behaves like Ctrl-C: uvicorn drains, then the finally below stops the children in order.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    redis_server: EmbeddedRedis | None = None
    workers: list[LocalWorker] = []
    try:
        redis_url = settings.redis_url
        if redis_url is None:
            redis_server = EmbeddedRedis(settings.data_dir)
            try:
                redis_server.start()
            except (RuntimeError, OSError) as error:
                print(f"minify-server: the embedded Redis did not start: {error}", file=sys.stderr)
                return 1
            redis_url = redis_server.url
            workers = _start_workers(settings, redis_url)
        app = create_app(settings, redis_url)
        log.info("minify at http://%s:%d (data in %s)", settings.host, settings.port, settings.data_dir)
        config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=args.log_level,
                                access_log=False, timeout_graceful_shutdown=5)
        StoppingServer(config, app.state.stopping).run(sockets=[listener])
    except KeyboardInterrupt:
        pass
    finally:
        listener.close()
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not abandon the children
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for worker in workers:
            worker.stop()
        if redis_server is not None:
            redis_server.stop()
    return 0


class StoppingServer(uvicorn.Server):
    """uvicorn's server, which first tells the app it is stopping (`stopping` set): the open event
    streams end then, before the graceful wait, instead of being cancelled mid-read when it runs out
    (a CancelledError traceback per watcher)."""

    def __init__(self, config: uvicorn.Config, stopping: asyncio.Event) -> None:
        super().__init__(config)
        self.stopping = stopping

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.stopping.set()
        await super().shutdown(sockets)


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (IPv6 where the host says so), SO_REUSEADDR as uvicorn sets it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=2048)


def _start_workers(settings: Settings, redis_url: str) -> list[LocalWorker]:
    env = dict(os.environ)
    env["MINIFY_ALLOWED_BACKENDS"] = settings.allowed_backends
    env["MINIFY_ALLOW_PICKLE"] = "1" if settings.allow_pickle else "0"
    queues = settings.worker_queues or local_worker_queues()
    workers = [LocalWorker(index, redis_url, queues, env) for index in range(settings.workers)]
    for worker in workers:
        worker.start()
    return workers


if __name__ == "__main__":
    sys.exit(main())
