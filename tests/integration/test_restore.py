"""A killed worker's unacked messages come back under steady load, on every pool.

kombu restores them on prefork's event-loop timer; the other pools only when a poll of
the queue comes back empty, which never happens under steady load. The library restores
them on those workers' timers too (``broker/restore.py``)."""

from __future__ import annotations

import threading
import time

import pytest

from ..conftest import CeleryEnv
from ..support.runs import started, wait_for
from ..support.workers import Worker

pytestmark = pytest.mark.slow

VISIBILITY = 4.0


@pytest.mark.parametrize("pool", [pytest.param("gevent", marks=pytest.mark.oneoff), "threads"])
def test_a_killed_workers_message_comes_back_while_the_queue_stays_busy(
    cenv: CeleryEnv, pool: str
) -> None:
    env = {"CSL_VISIBILITY_TIMEOUT": str(VISIBILITY)}
    queue = f"restore-{pool}"
    doomed = Worker(cenv.env, pool=pool, concurrency=4, extra_env=env, queue=queue).start()
    survivor: Worker | None = None
    busy = threading.Event()
    try:
        swarm = cenv.app_module.swarm
        # Held unacked by the doomed worker until its countdown: the worker dies first.
        held = swarm.apply_async(("restore-held", 0.01), countdown=60, queue=queue)
        wait_for(lambda: f"[{held.id}] received" in doomed.output(), 20, "the doomed worker")
        doomed.kill()
        survivor = Worker(cenv.env, pool=pool, concurrency=4, extra_env=env, queue=queue).start()

        def load() -> None:  # never an empty poll: a message every 20 ms
            n = 0
            while not busy.is_set():
                swarm.apply_async((f"restore-load-{n % 8}", 0.005), queue=queue)
                n += 1
                time.sleep(0.02)

        producer = threading.Thread(target=load, daemon=True)
        producer.start()
        killed = time.monotonic()
        # Back after the visibility timeout and the restore interval (1 s in the test app),
        # while the load goes on: the survivor receives it (and holds it to its eta).
        wait_for(lambda: survivor is not None and f"[{held.id}] received" in survivor.output(),
                 VISIBILITY + 8, "the held message to come back under load")  # fmt: skip
        came_back = time.monotonic() - killed
        assert producer.is_alive()  # the load never stopped
    finally:
        busy.set()
        doomed.stop()
        if survivor is not None:
            survivor.stop()
    assert came_back < VISIBILITY + 8
    assert not any(s["id"] == held.id for s in started(cenv))  # its countdown is a minute
