"""What the service's tests share: a redis-server on a TCP port (tests/support/private_redis.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.private_redis import redis_on_a_port


@pytest.fixture(scope="module")
def server_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A redis-server for the module's tests, as a deployment's Redis (an append-only file): its port."""
    with redis_on_a_port(tmp_path_factory.mktemp("redis")) as port:
        yield port
