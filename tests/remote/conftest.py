"""A real redis-server for each test module of the remote tier, on a free loopback port
(tests/redis_server.py), stopped when the module ends."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from redis_server import RedisServer


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    from redis_server import running_redis  # imports the redis client, which each module checks for

    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
def url(redis_server: RedisServer) -> str:
    """The module's server, empty."""
    from redis_server import emptied

    return emptied(redis_server).url
