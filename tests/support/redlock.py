"""Redlock over private redis-server masters: the masters, the store on them, a fenced write."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from celery_singleton_lock import Contended, Lease, Redlock

from .servers import RedisServer

# A store refusing a write whose fence is not above the last it accepted (Kleppmann's).
FENCED_WRITE = """
local last = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) <= last then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
return 1
"""


def held(outcome: Lease | Contended) -> Lease:
    assert isinstance(outcome, Lease), outcome
    return outcome


def url_of(servers: list[RedisServer], password: str = "") -> str:
    auth = f":{password}@" if password else ""
    return "redlock://" + auth + ",".join(f"127.0.0.1:{s.port}" for s in servers) + "/0"


@contextlib.contextmanager
def masters(count: int, *servers: RedisServer) -> Iterator[list[RedisServer]]:
    started = [*servers, *(RedisServer() for _ in range(count - len(servers)))]
    try:
        yield [server if server.process else server.start() for server in started]
    finally:
        for server in started:
            server.cleanup()


def store(servers: list[RedisServer]) -> Redlock:
    return Redlock.from_url(url_of(servers), prefix="rl", socket_timeout=1.0,
                            socket_connect_timeout=1.0)  # fmt: skip
