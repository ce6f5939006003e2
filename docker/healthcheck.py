"""Container healthcheck for the minify images: exit 0 when healthy, 1 otherwise.

`healthcheck.py server`: the API answers `GET /healthz` with a 2xx (standard library only, no curl).
`healthcheck.py worker`: Redis answers and an RQ worker started in this container is registered there.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import urllib.request

DEFAULT_REDIS_URL = "redis://redis:6379/0"


def server_is_healthy(url: str, timeout_s: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return 200 <= response.status < 300
    except OSError as error:  # URLError and HTTPError (a 503 from /healthz) are both OSErrors
        print(f"{url}: {error}", file=sys.stderr)
        return False


def worker_is_healthy(redis_url: str, timeout_s: float) -> bool:
    # Imported here: only the worker image has redis and rq.
    from redis import Redis
    from redis.exceptions import RedisError
    from rq import Worker

    hostname = socket.gethostname()  # the container's id: RQ records it for every worker it registers
    try:
        connection = Redis.from_url(redis_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        workers = Worker.all(connection=connection)
    except RedisError as error:
        print(f"{redis_url}: {error}", file=sys.stderr)
        return False
    if any(worker.hostname == hostname for worker in workers):
        return True
    print(f"no RQ worker from host {hostname} is registered at {redis_url}", file=sys.stderr)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=["server", "worker"])
    parser.add_argument("--url", default="http://127.0.0.1:8000/healthz", help="server: the liveness URL")
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("MINIFY_REDIS_URL", DEFAULT_REDIS_URL),
        help="worker: the Redis the worker serves (default: $MINIFY_REDIS_URL)",
    )
    parser.add_argument("--timeout", type=float, default=4.0, help="seconds")
    args = parser.parse_args(argv)
    if args.role == "server":
        healthy = server_is_healthy(args.url, args.timeout)
    else:
        healthy = worker_is_healthy(args.redis_url, args.timeout)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
