"""Mutual exclusion under contention: threads x processes on one key, an external checker.

Each holder, inside its critical section, bumps an "inside" counter on a second Redis
server (outside the lock store) and appends its fence to a list there. The checker
then asserts nobody ever saw two holders, and fences rose in critical-section order.
"""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
import redis

from ..support.servers import RedisServer

HAMMER = """
import random, sys, threading, time
import redis
from celery_singleton_lock import RedisLock

lock_url, checker_url = sys.argv[1], sys.argv[2]
threads, rounds = int(sys.argv[3]), int(sys.argv[4])
lock = RedisLock.from_url(lock_url, prefix="hammer")
checker = redis.Redis.from_url(checker_url)
errors = []

def hammer(index):
    try:
        for _ in range(rounds):
            # Half the contenders block on the push signal, half spin with backoff.
            wait = "push" if index % 2 == 0 else "spin"
            lease = lock.acquire("one-key", ttl=10, timeout=60, wait=wait)
            try:
                if checker.incr("inside") != 1:
                    checker.incr("violations")
                checker.rpush("fences", lease.fence)
                time.sleep(random.random() / 2000)
                checker.decr("inside")
            finally:
                lock.release(lease)
    except BaseException as error:
        errors.append(error)

workers = [threading.Thread(target=hammer, args=(i,)) for i in range(threads)]
for w in workers: w.start()
for w in workers: w.join()
if errors:
    print(repr(errors[0]), file=sys.stderr)
    sys.exit(1)
"""


class TestMutualExclusion:
    @pytest.mark.slow
    def test_threads_across_processes_never_hold_one_key_together(
        self, redis_server: RedisServer, checker_server: RedisServer, raw: redis.Redis
    ) -> None:
        checker = checker_server.client()
        checker.flushall()
        processes, threads, rounds = 3, 4, 25
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    HAMMER,
                    redis_server.url,
                    checker_server.url,
                    str(threads),
                    str(rounds),
                ]
            )
            for _ in range(processes)
        ]
        try:
            codes = [p.wait(timeout=90) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(5)
        assert codes == [0] * processes
        fences = [int(f) for f in checker.lrange("fences", 0, -1)]
        print(
            f"\n{len(fences)} critical sections by {processes}x{threads} contenders, "
            f"violations: {int(checker.get('violations') or 0)}"
        )
        assert checker.get("violations") is None
        assert len(fences) == processes * threads * rounds
        assert all(a < b for a, b in itertools.pairwise(fences))
        assert raw.get("hammer:{one-key}") is None
