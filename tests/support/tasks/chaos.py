"""The chaos suite's tasks: a swarm taking turns, and writers through a fenced store."""

from __future__ import annotations

import time
from typing import Any

from celery_singleton_lock import LockLostError, requeue, singleton_task

from ..celery_app import app
from .records import begin, checker, checker_time, hold, record

# A store that refuses a write carrying a fence older than the last it accepted: the
# "fenced store" of Kleppmann's argument, as one Lua script on the checker's Redis.
FENCED_WRITE = """
local last = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) <= last then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
return 1
"""


def fenced_write(item: object, fence: int) -> bool:
    return bool(checker().eval(FENCED_WRITE, 1, f"fenced:{item}", fence))


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    dedupe=False,
    on_contention=requeue(max_tries=1000, backoff=0.02, cap=0.3),
)
def swarm(self: Any, item: object, seconds: float = 0.01) -> object:
    """Many copies of few keys, all through the execution level: they take turns."""
    return hold(self, item, seconds)


# The fenced writers: a copy waits its turn at execution (no dedupe at dispatch).
WRITER: dict[str, Any] = {
    "app": app, "bind": True, "key": ["item"], "dedupe": False,
    "on_contention": requeue(max_tries=1000, backoff=0.05, cap=0.5),
}  # fmt: skip


@singleton_task(**WRITER)
def fenced_writer(self: Any, item: object, seconds: float = 0.0) -> dict[str, bool]:
    """Hold the key for ``seconds`` (in small steps, so a pause lands mid-way), then write
    through the fenced store and check the lease, recording both outcomes."""
    started = begin(self, item)
    deadline = time.time() + seconds
    while time.time() < deadline:
        time.sleep(0.02)
    accepted = fenced_write(item, self.lease.fence)
    try:
        self.lease.check()
        lost = False
    except LockLostError:
        lost = True
    record(self, item, started, accepted=accepted, lost=lost)
    return {"accepted": accepted, "lost": lost}


@singleton_task(**WRITER)
def cut_off_writer(self: Any, item: object, seconds: float = 0.0) -> dict[str, Any]:
    """``fenced_writer`` that also records when it learned of a loss: the ``on_lost``
    callback's time (by this process's clock, and by the checker's, which no test
    fakes), and the first time ``check()`` raised (polled every 10 ms)."""
    lost_at: list[tuple[float, float]] = []
    self.lease.on_lost(lambda _: lost_at.append((time.time(), checker_time())))
    started = begin(self, item)
    raised_at = None
    deadline = time.monotonic() + seconds  # its own length: the clock tests step time()
    while time.monotonic() < deadline:
        if raised_at is None:
            try:
                self.lease.check()
            except LockLostError:
                raised_at = time.time()
        time.sleep(0.01)
    accepted = fenced_write(item, self.lease.fence)
    outcome = {
        "accepted": accepted,
        "lost": raised_at is not None,
        "lost_at": lost_at[0][0] if lost_at else None,
        "lost_at_real": lost_at[0][1] if lost_at else None,
        "check_raised_at": raised_at,
    }
    record(self, item, started, **outcome)
    return outcome
