"""A producer process for the connection tests: N ``delay()`` calls, each from a new thread,
gevent greenlet or eventlet greenthread, then one JSON line with what it saw.

    python -m tests.support.producers MODE COUNT BROKER_URL LOCK_URL

MODE is ``threads``, ``gevent`` or ``eventlet``. Green modes patch the standard library
first, as a green app (or ``celery worker -P gevent``) does. At most ``WAVE`` callers run
at once; the lock store's client count (``CLIENT LIST``, the producer's own connections
only) is sampled after every wave.
"""

from __future__ import annotations

import sys

MODE = sys.argv[1] if len(sys.argv) > 1 else "threads"
if MODE == "gevent":
    from gevent import monkey

    monkey.patch_all()
elif MODE == "eventlet":
    import eventlet

    eventlet.monkey_patch()

import json  # noqa: E402  (after monkey patching, as green apps must)
import threading  # noqa: E402
import time  # noqa: E402

import redis  # noqa: E402
from celery import Celery  # noqa: E402

from celery_singleton_lock import SingletonTask  # noqa: E402

WAVE = 100


def main(count: int, broker_url: str, lock_url: str) -> None:
    app = Celery("producers", broker=broker_url, set_as_current=False)
    app.conf.singleton_lock_url = lock_url
    app.conf.broker_pool_limit = 10

    @app.task(base=SingletonTask, name="producers.job", shared=False)
    def job(n: int) -> int:
        return n

    observer = redis.Redis.from_url(lock_url)
    observer.client_setname("observer")
    errors: list[str] = []
    done = [0]

    def one(n: int) -> None:
        try:
            job.delay(n)
            done[0] += 1
        except Exception as error:
            errors.append(f"{type(error).__name__}: {error}")

    def clients() -> int:
        return sum(1 for c in observer.client_list() if c.get("name") != "observer")

    peak = 0
    started = time.monotonic()
    for first in range(0, count, WAVE):
        if MODE == "gevent":
            import gevent

            gevent.joinall([gevent.spawn(one, n) for n in range(first, min(count, first + WAVE))])
        elif MODE == "eventlet":
            pool = eventlet.GreenPool(WAVE)
            for n in range(first, min(count, first + WAVE)):
                pool.spawn_n(one, n)
            pool.waitall()
        else:
            wave = [threading.Thread(target=one, args=(n,)) for n in range(first, first + WAVE)]
            for thread in wave[: count - first]:
                thread.start()
            for thread in wave[: count - first]:
                thread.join(30)
        peak = max(peak, clients())
    print(
        json.dumps(
            {
                "mode": MODE,
                "count": count,
                "ok": done[0],
                "errors": errors[:5],
                "error_count": len(errors),
                "peak_clients": peak,
                "final_clients": clients(),
                "seconds": round(time.monotonic() - started, 2),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main(int(sys.argv[2]), sys.argv[3], sys.argv[4])
