"""One Redis server as broker (db 0) and lock store (db 1), and producer processes on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import redis

from ..conftest import CeleryEnv
from .servers import RedisServer
from .workers import ROOT

QUEUE = "ride"


def at(server: RedisServer, db: int) -> redis.Redis:
    """A client of database ``db`` of ``server``."""
    return redis.Redis.from_url(f"{server.url.rsplit('/', 1)[0]}/{db}")


def same_server_env(shared: RedisServer, cenv: CeleryEnv, **extra: str) -> dict[str, str]:
    shared.client().flushall()
    base = shared.url.rsplit("/", 1)[0]
    return {
        **cenv.env,
        "CSL_BROKER_URL": f"{base}/0",
        "CSL_LOCK_URL": f"{base}/1",
        "CSL_QUEUE": QUEUE,
        **extra,
    }


def produce(env: dict[str, str], code: str, timeout: float = 60) -> Any:
    """Run ``code`` in a new producer process (the test app configured from ``env``);
    it prints one JSON value as its last line."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT, env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def holds(locks: redis.Redis) -> dict[str, str]:
    """Lock name -> holder token, for every hold in the lock store (prefix ``t``)."""
    found = {}
    for key in locks.scan_iter(match="t:{*}"):  # lock keys, not their fence keys
        value = locks.get(key)
        if value is not None:
            found[key.decode()[3:-1]] = value.decode()
    return found
