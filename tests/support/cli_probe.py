"""Runs ``celery <args>`` while counting the lock store's round trips and peak memory.

    python -m tests.support.cli_probe -A tests.support.celery_app singleton list --json

redis-py's SCAN calls, scripts and pipeline executions are counted (each is one round
trip); at exit one line goes to stderr:
``probe: scans=N pipelines=N commands=N scripts=N maxrss_kib=N``.
"""

from __future__ import annotations

import atexit
import resource
import sys
from typing import Any

import redis.client
from celery.__main__ import main

counts = {"scans": 0, "pipelines": 0, "commands": 0, "scripts": 0}
_scan = redis.client.Redis.scan
_execute = redis.client.Pipeline.execute
_command = redis.client.Redis.execute_command


def command(self: Any, *args: Any, **options: Any) -> Any:
    if args and str(args[0]).upper() in ("EVAL", "EVALSHA"):
        counts["scripts"] += 1
    return _command(self, *args, **options)


def scan(self: Any, *args: Any, **kwargs: Any) -> Any:
    counts["scans"] += 1
    return _scan(self, *args, **kwargs)


def execute(self: Any, *args: Any, **kwargs: Any) -> Any:
    counts["pipelines"] += 1
    counts["commands"] += len(self.command_stack)
    return _execute(self, *args, **kwargs)


def report() -> None:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fields = " ".join(f"{k}={v}" for k, v in counts.items())
    sys.stderr.write(f"probe: {fields} maxrss_kib={peak}\n")


redis.client.Redis.scan = scan  # type: ignore[method-assign]
redis.client.Pipeline.execute = execute  # type: ignore[method-assign]
redis.client.Redis.execute_command = command  # type: ignore[method-assign]
atexit.register(report)

if __name__ == "__main__":
    sys.argv[0] = "celery"
    main()
