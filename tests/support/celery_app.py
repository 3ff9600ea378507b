"""The Celery app the lifecycle tests run in real worker processes.

Configured from the environment so one module serves every worker the tests start:
``CSL_BROKER_URL`` (broker, and result backend unless ``CSL_RESULT_URL``),
``CSL_LOCK_URL`` (the lock store, a separate server so tests can take it down alone),
``CSL_CHECK_URL`` (where executions are recorded, outside the lock store),
``CSL_VISIBILITY_TIMEOUT``, ``CSL_RIDE`` (0: kombu's own transport),
``CSL_TRANSIT_TIMEOUT``, ``CSL_KEYPREFIX`` (kombu's ``global_keyprefix``),
``CSL_CONSUMER_TIMEOUT`` (a RabbitMQ broker's, as the app says it is).

Each execution appends ``{"task", "id", "item", "fence", "pid", "start", "end", ...}``
to the list ``runs`` on the checker, so tests can assert who ran, when, and whether two
executions of one key ever overlapped.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import redis
from celery import Celery
from celery.exceptions import Ignore, Reject, SoftTimeLimitExceeded
from celery.signals import before_task_publish

from celery_singleton_lock import (
    LockLostError,
    RateLimit,
    SingletonTask,
    TaskCancelledError,
    fail,
    requeue,
    singleton_task,
    skip,
    wait,
)
from celery_singleton_lock.tokens import ATTEMPT_HEADER, RETRY_OF_HEADER

app = Celery("tests.support.celery_app")
app.conf.update(
    task_default_queue=os.environ.get("CSL_QUEUE", "celery"),
    broker_url=os.environ.get("CSL_BROKER_URL", "redis://127.0.0.1:6379/0"),
    result_backend=os.environ.get("CSL_RESULT_URL")
    or os.environ.get("CSL_BROKER_URL", "redis://127.0.0.1:6379/0"),
    # CSL_LOCK_URL="" leaves the lock store to be found from the backend or broker.
    singleton_lock_url=os.environ.get("CSL_LOCK_URL", "redis://127.0.0.1:6379/0") or None,
    singleton_lock_prefix="t",
    # The metrics tests have a worker serve Prometheus metrics (CSL_METRICS_PORT).
    singleton_lock_metrics_port=int(os.environ["CSL_METRICS_PORT"])
    if os.environ.get("CSL_METRICS_PORT")
    else None,
    singleton_lock_ttl=float(os.environ.get("CSL_TTL", "10")),
    # CSL_RIDE=0: kombu's own transport even where the hold could ride the push.
    singleton_lock_ride_broker=os.environ.get("CSL_RIDE", "1") != "0",
    # Messages lost between the broker's pop and a worker's receipt: pushed again after.
    singleton_lock_transit_timeout=float(os.environ.get("CSL_TRANSIT_TIMEOUT", "10")),
    # A transport named here is kept (the soak's control names kombu's own).
    **(
        {"broker_transport": os.environ["CSL_BROKER_TRANSPORT"]}
        if os.environ.get("CSL_BROKER_TRANSPORT")
        else {}
    ),
    singleton_lock_on_redis_error=os.environ.get("CSL_ON_REDIS_ERROR", "fail_closed"),
    # A RabbitMQ server's consumer_timeout, as the app says it is (CSL_CONSUMER_TIMEOUT).
    singleton_lock_consumer_timeout=float(os.environ.get("CSL_CONSUMER_TIMEOUT", "1800")),
    # The version matrix runs the lock store on RESP3 too (CSL_PROTOCOL=3).
    singleton_lock_transport_options={
        **({"protocol": int(os.environ["CSL_PROTOCOL"])} if os.environ.get("CSL_PROTOCOL") else {}),
        # The partition tests shorten the lock store's timeouts (CSL_SOCKET_TIMEOUT).
        **(
            {
                "socket_timeout": float(os.environ["CSL_SOCKET_TIMEOUT"]),
                "socket_connect_timeout": float(os.environ["CSL_SOCKET_TIMEOUT"]),
            }
            if os.environ.get("CSL_SOCKET_TIMEOUT")
            else {}
        ),
    },
    broker_transport_options={
        "visibility_timeout": float(os.environ.get("CSL_VISIBILITY_TIMEOUT", "3600")),
        # Sweep for unacked messages every second, so a short visibility timeout really
        # redelivers during a test (kombu's default sweep is every ~100 s).
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
        # The sweep holds a mutex in the broker; a worker SIGKILLed while holding it
        # stops every sweep until the mutex expires (kombu's default: 300 s).
        "unacked_mutex_expire": 10,
        # kombu's global_keyprefix for every broker key (CSL_KEYPREFIX).
        **(
            {"global_keyprefix": os.environ["CSL_KEYPREFIX"]}
            if os.environ.get("CSL_KEYPREFIX")
            else {}
        ),
        # A Sentinel broker (sentinel:// in CSL_BROKER_URL) names its master here.
        **(
            {"master_name": os.environ["CSL_MASTER_NAME"]}
            if "CSL_MASTER_NAME" in os.environ
            else {}
        ),
    },
    result_backend_transport_options=(
        {"master_name": os.environ["CSL_MASTER_NAME"]} if "CSL_MASTER_NAME" in os.environ else {}
    ),
    worker_prefetch_multiplier=1,
    task_track_started=True,
    broker_connection_retry_on_startup=True,
)

# CSL_QUEUE_TYPE=quorum: RabbitMQ quorum queues on a topic exchange with publisher
# confirms, as Celery 5.5+ steers new deployments; countdowns then go through kombu's
# native delayed delivery (CSL_EXCHANGE_TYPE=direct: Celery cannot delay natively).
if os.environ.get("CSL_QUEUE_TYPE"):
    app.conf.update(
        task_default_queue_type=os.environ["CSL_QUEUE_TYPE"],
        task_default_exchange_type=os.environ.get("CSL_EXCHANGE_TYPE", "topic"),
        broker_transport_options={**app.conf.broker_transport_options, "confirm_publish": True},
    )
    if os.environ.get("CSL_DELIVERY_LIMIT"):  # RabbitMQ 4 sets 20 on every quorum queue
        from kombu import Exchange, Queue

        _queue = app.conf.task_default_queue
        app.conf.task_queues = [
            Queue(
                _queue,
                Exchange(_queue, type=app.conf.task_default_exchange_type),
                routing_key=_queue,
                queue_arguments={
                    "x-queue-type": "quorum",
                    "x-delivery-limit": int(os.environ["CSL_DELIVERY_LIMIT"]),
                },
            )
        ]

if os.environ.get("CSL_FOREIGN_SETTINGS"):
    # Settings ported from celery-once and celery-singleton: warned about at worker start.
    app.conf.ONCE = {"backend": "celery_once.backends.Redis", "settings": {"url": "x"}}
    app.conf.singleton_key_prefix = "SINGLETONLOCK_"
    app.conf.singleton_raise_on_duplicate = True
    app.conf.singleton_backend_url = "redis://:hunter2@127.0.0.1:1/0"
    app.conf.singleton_lock_expiry = 60

if os.environ.get("CSL_BEAT_TASK"):
    # For the beat tests: one entry that ticks every CSL_BEAT_EVERY seconds.
    app.conf.beat_schedule = {
        "tick": {
            "task": os.environ["CSL_BEAT_TASK"],
            "schedule": float(os.environ.get("CSL_BEAT_EVERY", "0.5")),
            "args": ("tick", float(os.environ.get("CSL_BEAT_SECONDS", "2.0"))),
            "options": {"queue": os.environ.get("CSL_QUEUE", "celery")},
        }
    }

_checker: redis.Redis | None = None


def _check_url() -> str:
    return os.environ.get("CSL_CHECK_URL", "redis://127.0.0.1:6379/1")


def checker() -> redis.Redis:
    global _checker  # noqa: PLW0603  (one client per process, created after fork)
    if _checker is None:
        _checker = redis.Redis.from_url(_check_url())
    return _checker


def checker_time() -> float:
    """The checker server's clock: real time for a process whose own clock is faked."""
    seconds, micros = checker().time()
    return float(seconds) + micros / 1e6


def _record(task: Any, item: object, started: float, **extra: Any) -> None:
    lease = task.lease
    checker().rpush(
        "runs",
        json.dumps(
            {
                "task": task.name,
                "id": task.request.id,
                "item": item,
                "key": lease.name,
                "fence": lease.fence,
                "pid": os.getpid(),
                "retries": task.request.retries,
                "start": started,
                "end": time.time(),
                # RabbitMQ's dead-letterings of this message (its delay exchanges add their
                # own): one sent again must not carry its request's.
                **_deaths(task.request.headers),
                **extra,
            }
        ),
    )


def _deaths(headers: Any) -> dict[str, list[str]]:
    deaths = (headers or {}).get("x-death")
    if not deaths:
        return {}
    return {"x_death": [f"{d.get('reason')}:{d.get('queue')}" for d in deaths]}


def _begin(task: Any, item: object) -> float:
    started = time.time()
    checker().rpush(
        "started", json.dumps({"id": task.request.id, "item": item, "pid": os.getpid()})
    )
    return started


GATE_CLIENT = "test-gate"


def _pause(item: object, seconds: float) -> None:
    """Sleep ``seconds``; a negative value (``runs.UNTIL_OPENED``) waits instead until the
    test opens the item's gate, at most -seconds."""
    if seconds < 0:
        # A connection of its own, named, so a count of the clients parked on a push
        # wake-up (``runs.waiting_for_a_wake_up``) leaves it out.
        with redis.Redis.from_url(_check_url(), client_name=GATE_CLIENT) as gate:
            gate.blpop([f"gate:{item}"], timeout=-seconds)
    else:
        time.sleep(seconds)


def _hold(task: Any, item: Any, seconds: float) -> Any:
    """The plain execution: hold the key for ``seconds``, record it, return the item."""
    started = _begin(task, item)
    _pause(item, seconds)
    _record(task, item, started)
    return item


def _work(task: Any, item: object, seconds: float, mode: str) -> object:
    started = _begin(task, item)
    if mode == "soft":
        try:
            time.sleep(seconds)
        except SoftTimeLimitExceeded:
            _record(task, item, started, soft_handled=True)
            return "soft-handled"
    _pause(item, seconds)
    if mode in ("retry", "retry_later") and task.request.retries == 0:
        _record(task, item, started, retrying=True)
        raise task.retry(countdown=1.0 if mode == "retry" else 5.0, max_retries=1)
    if mode == "fail":
        _record(task, item, started, failed=True)
        raise ValueError(f"failing on purpose for {item}")
    if mode == "ignore":
        _record(task, item, started)
        raise Ignore()
    if mode == "reject":
        _record(task, item, started)
        raise Reject("rejecting on purpose", requeue=False)
    _record(task, item, started)
    return item


@singleton_task(app=app, bind=True, key=["item"])
def work(self: Any, item: object, seconds: float = 0.0, mode: str = "ok") -> object:
    """Record an execution of ``item``; ``mode`` picks how the execution ends."""
    return _work(self, item, seconds, mode)


@singleton_task(app=app, bind=True, key=["item"], soft_time_limit=0.5, time_limit=1.0)
def limited(self: Any, item: object, seconds: float = 0.0, mode: str = "ok") -> object:
    """Time limits are task options: the soft one raises in the body, the hard one kills."""
    return _work(self, item, seconds, mode)


@singleton_task(app=app, bind=True, key=["item"], acks_late=True, time_limit=2.0)
def durable_limited(self: Any, item: object, seconds: float = 0.0) -> object:
    """acks_late with a time limit: the message stays unacked while it runs."""
    return _hold(self, item, seconds)


@singleton_task(app=app, bind=True, key=["item"], acks_late=True, reject_on_worker_lost=True)
def durable(self: Any, item: object, seconds: float = 0.0) -> object:
    """acks_late + reject_on_worker_lost: a killed child's message is redelivered."""
    return _hold(self, item, seconds)


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    autoretry_for=(KeyError,),
    retry_backoff=False,
    default_retry_delay=1,
    max_retries=1,
)
def flaky(self: Any, item: object) -> object:
    """Raises KeyError on its first attempt; autoretry_for re-sends it."""
    started = _begin(self, item)
    _record(self, item, started)
    if self.request.retries == 0:
        raise KeyError(item)
    return item


@singleton_task(app=app, bind=True, key=["item"], on_contention="fail", dedupe=False)
def strict(self: Any, item: object, seconds: float = 0.0) -> object:
    """Never queued twice is off (dedupe=False); a contended execution fails at once."""
    return _hold(self, item, seconds)


@singleton_task(app=app, bind=True, key=["item"], on_contention=wait(timeout=20), dedupe=False)
def patient(self: Any, item: object, seconds: float = 0.0) -> object:
    """A contended execution waits for the push wake-up."""
    return _hold(self, item, seconds)


@app.task(bind=True, base=SingletonTask, singleton={"key": "request:{request_idx}"})
def process_request(self: Any, request_idx: int, seconds: float = 0.0) -> int:
    """The base-class form, sharing one lock per request with ``callback_request``."""
    return _hold(self, request_idx, seconds)


@singleton_task(app=app, bind=True, key="request:{request_idx}")
def callback_request(self: Any, request_idx: int, seconds: float = 0.0) -> int:
    return _hold(self, request_idx, seconds)


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    on_contention=requeue(max_tries=2, backoff=0.1, cap=0.2),
    dedupe=False,
)
def impatient(self: Any, item: object, seconds: float = 0.0) -> object:
    """Requeued at most twice while contended, then fails."""
    return _hold(self, item, seconds)


@singleton_task(app=app, bind=True, key=["item"], lock="while_executing")
def work_while_executing(self: Any, item: object, seconds: float = 0.0, mode: str = "ok") -> object:
    """No dispatch check: held only while it runs (its retry keeps the key meanwhile)."""
    return _work(self, item, seconds, mode)


@singleton_task(app=app, bind=True, key=["item"], on_contention="fail")
def exclusive_fail(self: Any, item: object, seconds: float = 0.0) -> object:
    """Deduped at dispatch; a copy that reaches execution anyway fails at once."""
    return _hold(self, item, seconds)


@singleton_task(app=app, bind=True, key=["item"], on_contention=wait(timeout=0.3, then=fail()))
def exclusive_wait_fail(self: Any, item: object, seconds: float = 0.0) -> object:
    """A contended execution waits briefly, then fails."""
    return _hold(self, item, seconds)


@singleton_task(app=app, bind=True, key=["item"], on_contention="skip")
def exclusive_skip(self: Any, item: object, seconds: float = 0.0) -> object:
    """A contended execution is dropped quietly (IGNORED)."""
    return _hold(self, item, seconds)


@singleton_task(app=app, bind=True, key=["item"], on_contention=wait(timeout=0.3, then=skip()))
def exclusive_wait_skip(self: Any, item: object, seconds: float = 0.0) -> object:
    """A contended execution waits briefly, then is dropped quietly."""
    return _hold(self, item, seconds)


@app.task
def note_error(request: Any, exc: Any, traceback: Any) -> None:
    """An errback (link_error): records which task id it fired for."""
    checker().rpush("errbacks", str(request.id))


# -- chaos suite ------------------------------------------------------------------------

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
    return _hold(self, item, seconds)


# The fenced writers: a copy waits its turn at execution (no dedupe at dispatch).
WRITER: dict[str, Any] = {
    "app": app, "bind": True, "key": ["item"], "dedupe": False,
    "on_contention": requeue(max_tries=1000, backoff=0.05, cap=0.5),
}  # fmt: skip


@singleton_task(**WRITER)
def fenced_writer(self: Any, item: object, seconds: float = 0.0) -> dict[str, bool]:
    """Hold the key for ``seconds`` (in small steps, so a pause lands mid-way), then write
    through the fenced store and check the lease, recording both outcomes."""
    started = _begin(self, item)
    deadline = time.time() + seconds
    while time.time() < deadline:
        time.sleep(0.02)
    accepted = fenced_write(item, self.lease.fence)
    try:
        self.lease.check()
        lost = False
    except LockLostError:
        lost = True
    _record(self, item, started, accepted=accepted, lost=lost)
    return {"accepted": accepted, "lost": lost}


@singleton_task(**WRITER)
def cut_off_writer(self: Any, item: object, seconds: float = 0.0) -> dict[str, Any]:
    """``fenced_writer`` that also records when it learned of a loss: the ``on_lost``
    callback's time (by this process's clock, and by the checker's, which no test
    fakes), and the first time ``check()`` raised (polled every 10 ms)."""
    lost_at: list[tuple[float, float]] = []
    self.lease.on_lost(lambda _: lost_at.append((time.time(), checker_time())))
    started = _begin(self, item)
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
    _record(self, item, started, **outcome)
    return outcome


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    lock="until_executing",
    on_contention=requeue(max_tries=500, backoff=0.05, cap=0.2),
)
def refresh(self: Any, item: object, seconds: float = 0.0, mode: str = "ok") -> object:
    """One running + one pending: a call made while one runs queues the next run."""
    return _work(self, item, seconds, mode)


@singleton_task(
    app=app, bind=True, key=["item"], lock="until_executing", on_contention=wait(timeout=20)
)
def refresh_waiting(self: Any, item: object, seconds: float = 0.0) -> object:
    """until_executing whose pending execution waits for the running one (push wake-up)."""
    return _hold(self, item, seconds)


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    throttle=float(os.environ.get("CSL_THROTTLE", "1.5")),
    on_contention=requeue(max_tries=500, backoff=0.05, cap=0.2),
)
def throttled(self: Any, item: object, seconds: float = 0.0) -> object:
    """At most one accepted call per item per window; executions still exclude."""
    return _hold(self, item, seconds)


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    limit=3,
    on_contention=requeue(max_tries=1000, backoff=0.02, cap=0.1),
)
def export(self: Any, item: object, seconds: float = 0.0, mode: str = "ok") -> object:
    """At most three executions per item at once (a counting lease)."""
    return _work(self, item, seconds, mode)


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    limit=2,
    total_limit=3,
    on_contention=wait(timeout=60),
)
def export_total(self: Any, item: object, seconds: float = 0.0, until: str = "") -> object:
    """Two at once per item, three at once for every item together; the rest wait.

    ``until``: run on until the checker has that key (so a test frees slots one by one).
    """
    return _until(self, item, seconds, until)


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    limit=1,
    total_limit=3,
    on_contention=wait(timeout=60),
)
def export_one_total(
    self: Any, item: object, seconds: float = 0.0, until: str = "", mode: str = "ok"
) -> object:
    """One at once per item (a tenant), three at once for every item together; the rest
    wait. ``until`` as ``export_total``'s; ``mode``: ``"fail"`` raises, ``"retry"``
    retries its first attempt after 0.5 s."""
    return _until(self, item, seconds, until, mode)


def _until(task: Any, item: object, seconds: float, until: str, mode: str = "ok") -> object:
    """Run until the checker has ``until`` (when given), then ``seconds``; end as ``mode``
    says."""
    started = _begin(task, item)
    deadline = time.monotonic() + 60.0
    while until and not checker().exists(until) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(seconds)
    if mode == "retry" and task.request.retries == 0:
        _record(task, item, started, retrying=True)
        raise task.retry(countdown=0.5, max_retries=1)
    if mode == "fail":
        _record(task, item, started, failed=True)
        raise ValueError(f"failing on purpose for {item}")
    _record(task, item, started)
    return item


@singleton_task(app=app, bind=True, key=["item"], limit=3, on_contention=wait(timeout=30))
def export_waiting(self: Any, item: object, seconds: float = 0.0) -> object:
    """limit=3 whose fourth execution waits for a slot (push wake-up, first come first served)."""
    return _hold(self, item, seconds)


def _versioned(task: Any, item: object, version: str, seconds: float) -> str:
    started = _begin(task, item)
    _pause(item, seconds)
    _record(task, item, started, version=version)
    return version


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    lock="until_executing",
    on_duplicate="replace",
    on_contention=requeue(max_tries=500, backoff=0.05, cap=0.2),
)
def latest(self: Any, item: object, version: str, seconds: float = 0.0) -> str:
    """One running + one pending, and the pending call takes the latest arguments."""
    return _versioned(self, item, version, seconds)


@singleton_task(app=app, bind=True, key=["item"], on_duplicate="replace")
def latest_queued(self: Any, item: object, version: str, seconds: float = 0.0) -> str:
    """The default scope with replace: a queued call takes the latest arguments."""
    return _versioned(self, item, version, seconds)


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    debounce=0.5,
    max_wait=1.5,
    on_contention=requeue(max_tries=500, backoff=0.05, cap=0.2),
)
def debounced(self: Any, item: object, version: str, seconds: float = 0.0) -> str:
    """Trailing debounce: one run 0.5 s after a burst's last call, within 1.5 s of its first."""
    return _versioned(self, item, version, seconds)


@singleton_task(app=app, key=["item"], ignore_result=True)
def noop(item: object) -> None:
    """The cheapest singleton task: counts itself (the worker-memory benchmark)."""
    checker().incr("noop")


@app.task
def plain(item: object) -> object:
    """A plain Celery task: what a pool does without this library, for comparison."""
    return item


def _throttled_30s(name: str, doc: str, **reopen: Any) -> Any:
    @singleton_task(
        app=app,
        bind=True,
        name=f"{__name__}.{name}",
        key=["item"],
        throttle=30,
        on_contention=requeue(max_tries=500, backoff=0.05, cap=0.2),
        **reopen,
    )
    def throttled(self: Any, item: object, seconds: float = 0.0, mode: str = "ok") -> object:
        return _work(self, item, seconds, mode)

    throttled.__doc__ = doc
    return throttled


throttled_reopen = _throttled_30s(
    "throttled_reopen",
    "A 30 s window per item that a failed or revoked run gives back at once.",
    reopen_on=("failure", "revoked"),
)
throttled_closed = _throttled_30s(
    "throttled_closed", "The same window without reopen_on: a failed run keeps it to its end."
)


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    reopen_on="failure",
    on_contention=requeue(max_tries=500, backoff=0.05, cap=0.2),
)
def reopened(self: Any, item: object, seconds: float = 0.0, mode: str = "ok") -> object:
    """until_executed whose failed run frees the key even while its retry waits."""
    return _work(self, item, seconds, mode)


def _rated(task: Any, item: str, n: int, seconds: float) -> int:
    """Record a rate-limited run: its slot (the lock store's clock) and when it began."""
    started = time.time()
    time.sleep(seconds)
    checker().rpush(
        "rated",
        json.dumps(
            {
                "task": task.name,
                "id": task.request.id,
                "item": item,
                "n": n,
                "slot": task.request.singleton_rate_slot,
                "start": started,
                "end": time.time(),
                "fence": task.lease.fence,
                "pid": os.getpid(),
            }
        ),
    )
    return n


@singleton_task(
    app=app, bind=True, key=["item"], rate="20/s", acks_late=True, reject_on_worker_lost=True
)
def rated(self: Any, item: str, n: int = 0, seconds: float = 0.0) -> int:
    """20 runs a second per item, across every worker; a killed worker's messages return."""
    return _rated(self, item, n, seconds)


def tokens_of(item: str, n: int = 0, seconds: float = 0.0) -> int:
    """What a call costs against a token limit: 1, 2 or 3 units (in turn for calls n
    made over three items in turn)."""
    return n // 3 % 3 + 1


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    rate=["20/s", RateLimit("40/2s", burst=6, cost=tokens_of)],
    acks_late=True,
    reject_on_worker_lost=True,
)
def rated_tokens(self: Any, item: str, n: int = 0, seconds: float = 0.0) -> int:
    """20 calls a second and 40 tokens per 2 s per item (``tokens_of`` each call)."""
    return _rated(self, item, n, seconds)


@singleton_task(app=app, bind=True, key=["item"], rate="20/s", max_pending=5)
def capped(self: Any, item: str, n: int = 0, seconds: float = 0.0) -> int:
    """20 runs a second per item, and at most 5 calls of an item waiting (refused past)."""
    return _rated(self, item, n, seconds)


@singleton_task(
    app=app, bind=True, key=["item"], rate="1/m", on_limited="delay", max_pending=3, queue_ttl=10
)
def capped_delayed(self: Any, item: str, n: int = 0, seconds: float = 0.0) -> int:
    """One run a minute per item, each call sent with the countdown to its slot; at most 3
    waiting, each waiting longer than its queue_ttl."""
    return _rated(self, item, n, seconds)


@singleton_task(
    app=app, bind=True, key=["item"], rate="1/4s", on_limited="delay", max_pending=3, queue_ttl=10
)
def capped_soon(self: Any, item: str, n: int = 0, seconds: float = 0.0) -> int:
    """One run per 4 s per item, each call sent with the countdown to its slot: a wait
    shorter than half its queue_ttl."""
    return _rated(self, item, n, seconds)


@singleton_task(app=app, bind=True, key=["item"], rate="1/m", on_limited="raise", max_pending=3)
def capped_checked(self: Any, item: str, n: int = 0, seconds: float = 0.0) -> int:
    """One a minute or RateLimitedError at dispatch, and at most 3 of an item waiting."""
    return _rated(self, item, n, seconds)


def tenant_plan(item: str, n: int = 0, seconds: float = 0.0) -> str:
    """A per-tenant plan: the paying tenants get four times the rate."""
    return "20/s" if item.startswith("gold") else "5/s"


@singleton_task(app=app, bind=True, key=["item"], rate=tenant_plan)
def planned(self: Any, item: str, n: int = 0, seconds: float = 0.0) -> int:
    return _rated(self, item, n, seconds)


@singleton_task(app=app, bind=True, key=["item"], rate="10/s", on_limited="delay")
def delayed(self: Any, item: str, n: int = 0, seconds: float = 0.0) -> int:
    """Sent with the countdown to its slot, reserved at dispatch."""
    return _rated(self, item, n, seconds)


@singleton_task(app=app, bind=True, key=["item"], rate="1/2s")
def rated_slowly(self: Any, item: str, n: int = 0, seconds: float = 0.0) -> int:
    """One run every 2 s per item: a backlog waits seconds for its slots (deferred)."""
    return _rated(self, item, n, seconds)


@singleton_task(app=app, bind=True, key=["item"], rate="1/2s", on_limited="delay")
def delayed_slowly(self: Any, item: str, n: int = 0, seconds: float = 0.0) -> int:
    """One run every 2 s per item, each sent with the countdown to its slot."""
    return _rated(self, item, n, seconds)


@singleton_task(app=app, bind=True, key=["item"], rate="10/s", burst=2, on_limited="raise")
def rate_checked(self: Any, item: str, n: int = 0, seconds: float = 0.0) -> int:
    """Refused with RateLimitedError at dispatch over 10/s (two back to back)."""
    return _rated(self, item, n, seconds)


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    rate="10/s",
    limit=2,
    on_contention=requeue(max_tries=500, backoff=0.05, cap=0.2),
)
def rated_pair(self: Any, item: str, n: int = 0, seconds: float = 0.0) -> int:
    """10 runs a second per item, and at most two at once."""
    return _rated(self, item, n, seconds)


class CancelHooked(SingletonTask):
    """Records when ``on_cancel`` is called (on a thread of its own)."""

    def on_cancel(self, task_id: str, lease: Any) -> None:
        checker().rpush("cancel_hooks", json.dumps({"id": task_id, "at": time.time()}))


def _preview(task: Any, item: str, version: str, seconds: float, obey: bool) -> str:
    """Work for ``seconds``, checking the lease every 20 ms unless told not to obey."""
    started = _begin(task, item)
    deadline = time.time() + seconds
    try:
        while time.time() < deadline:
            if obey:
                task.lease.check()
            time.sleep(0.02)
    except TaskCancelledError:
        _record(task, item, started, version=version, cancelled=True)
        raise
    _record(task, item, started, version=version, cancelled=task.lease.cancelled)
    return version


@singleton_task(
    app=app,
    base=CancelHooked,
    bind=True,
    key=["item"],
    on_duplicate="cancel",
    on_contention=wait(timeout=60),
)
def preview(self: Any, item: str, version: str, seconds: float = 0.0, obey: bool = True) -> str:
    """Re-render a preview: a newer call cancels the render in progress."""
    return _preview(self, item, version, seconds, obey)


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    on_duplicate="cancel",
    terminate_on_cancel=True,
    on_contention=wait(timeout=60),
)
def preview_hard(self: Any, item: str, version: str, seconds: float = 0.0) -> str:
    """The same, ignoring the cancel: its prefork child is terminated instead."""
    return _preview(self, item, version, seconds, obey=False)


@singleton_task(
    app=app,
    bind=True,
    key=["item"],
    on_duplicate="cancel",
    on_contention=wait(timeout=60),
    autoretry_for=(Exception,),
    max_retries=3,
    default_retry_delay=0,
)
def preview_retrying(self: Any, item: str, version: str, seconds: float = 0.0) -> str:
    """Retries whatever it raises: a cancel still ends it, in REVOKED."""
    return _preview(self, item, version, seconds, obey=True)


# The mode soak (tests/chaos/test_mode_soak.py): one task per mode, every one on the
# same workers, as a production app's task types share them.
_SOAK_CONTENTION = requeue(max_tries=2000, backoff=0.05, cap=0.3)
SOAK_MODES: dict[str, dict[str, Any]] = {
    "until_executing": {"lock": "until_executing", "on_contention": _SOAK_CONTENTION},
    "replace": {
        "lock": "until_executing", "on_duplicate": "replace", "on_contention": _SOAK_CONTENTION
    },
    "debounce": {"debounce": 0.2, "on_contention": _SOAK_CONTENTION},
    "throttle": {"throttle": 0.3, "on_contention": _SOAK_CONTENTION},
    "limit": {"limit": 2, "on_contention": _SOAK_CONTENTION},
    "rate": {"rate": "10/s"},
    "cancel": {"on_duplicate": "cancel", "on_contention": wait(timeout=60)},
}  # fmt: skip
SOAK_LIMIT, SOAK_RATE = 2, 10


def _soak(self: Any, item: str, seconds: float = 0.0) -> str:
    """Hold the key for ``seconds``, recording the run (and a rate's slot)."""
    started = _begin(self, item)
    time.sleep(seconds)
    _record(self, item, started, slot=getattr(self.request, "singleton_rate_slot", None))
    return item


@app.task(bind=True, acks_late=True, reject_on_worker_lost=True, name=f"{__name__}.soak_plain")
def soak_plain(self: Any, item: str, seconds: float = 0.0) -> str:
    """The soak's control: plain Celery, no lock, under the same kills."""
    _begin(self, item)
    time.sleep(seconds)
    return item


# acks_late with reject_on_worker_lost: a run killed with its pool child (or its whole
# worker) comes back, so every accepted call runs at least once through the kills.
soak_tasks = {
    mode: singleton_task(
        app=app, bind=True, key=["item"], name=f"{__name__}.soak_{mode}",
        acks_late=True, reject_on_worker_lost=True, **options,
    )(_soak)
    for mode, options in SOAK_MODES.items()
}  # fmt: skip


# The history tests (tests/integration/test_history.py): tasks that keep one (history=True)
# while the app's setting is off, one per way a lock's story goes.
@singleton_task(app=app, bind=True, key=["item"], history=True)
def chronicled(self: Any, item: str, seconds: float = 0.0) -> str:
    return str(_hold(self, item, seconds))


@singleton_task(app=app, bind=True, key=["item"], history=True, dedupe=False, on_contention="fail")
def chronicled_strict(self: Any, item: str, seconds: float = 0.0) -> str:
    return str(_hold(self, item, seconds))


@singleton_task(app=app, bind=True, key=["item"], history=True, on_duplicate="replace")
def chronicled_latest(self: Any, item: str, version: str) -> str:
    return version


@singleton_task(app=app, bind=True, key=["item"], history=True, rate="1/2s")
def chronicled_rated(self: Any, item: str, n: int = 0) -> int:
    return n


@singleton_task(app=app, bind=True, key=["item"], history=True, dedupe=False,
                on_contention=wait(timeout=10))  # fmt: skip
def chronicled_patient(self: Any, item: str, seconds: float = 0.0) -> str:
    return str(_hold(self, item, seconds))


def _requeue_at_once(state: Any) -> Any:  # a policy of the user's own
    return requeue(max_tries=20, backoff=0.05, cap=0.1)(state)


@singleton_task(app=app, bind=True, key=["item"], history=True, dedupe=False,
                on_contention=_requeue_at_once)  # fmt: skip
def chronicled_custom(self: Any, item: str, seconds: float = 0.0) -> str:
    return str(_hold(self, item, seconds))


@singleton_task(app=app, bind=True, key=["item"], history=True, limit=2)
def chronicled_limited(self: Any, item: str, seconds: float = 0.0) -> str:
    return str(_hold(self, item, seconds))


@singleton_task(app=app, bind=True, key=["item"], history=True, on_duplicate="cancel")
def chronicled_cancel(self: Any, item: str, seconds: float = 0.0) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        self.lease.check()  # raises TaskCancelledError once a newer call cancels this run
        time.sleep(0.05)
    return item


@singleton_task(app=app, bind=True, key=["item"], history=True, lock="until_executing",
                on_duplicate="replace")  # fmt: skip
def chronicled_pending(self: Any, item: str, version: str) -> str:
    return version


# With CSL_DIES_SENDING=1 (a worker's), a run of an item named so dies (SIGKILL) as it
# sends its message on: a requeue, after it passed the pending call's hold to that
# message, or a retry, after it passed the key. (Elsewhere no receiver is connected: one
# would turn off the dispatch's overlapped path, ``publish.dispatch.can_overlap``.)
DIES_SENDING = "dies-sending"


def _die_sending_on(body: Any = None, headers: Any = None, **_: Any) -> None:
    args = body[0] if isinstance(body, (list, tuple)) and body else ()
    sent_on = isinstance(headers, dict) and (
        ATTEMPT_HEADER in headers or RETRY_OF_HEADER in headers
    )
    if sent_on and args and str(args[0]).startswith(DIES_SENDING):
        os.kill(os.getpid(), signal.SIGKILL)


if os.environ.get("CSL_DIES_SENDING"):
    before_task_publish.connect(_die_sending_on)


class KillAfterSuccess(SingletonTask):
    """The whole prefork worker dies (SIGKILL) once per task id after Celery stored its
    success, before the ack: an acks_late message comes back after the visibility timeout."""

    def on_success(self, retval: Any, task_id: str, args: Any, kwargs: Any) -> None:
        if checker().set(f"killed:{task_id}", 1, nx=True):
            os.kill(os.getppid(), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)


@singleton_task(
    app=app, bind=True, key=["item"], idempotency={"key_from": "header:Idempotency-Key"}
)
def charge(self: Any, item: object, seconds: float = 0.0, mode: str = "ok") -> object:
    """A payment: its Idempotency-Key header makes a repeat answer with the first call."""
    return _work(self, item, seconds, mode)


@singleton_task(app=app, bind=True, key=["item"], idempotency={"keep_failures": True})
def charge_kept(self: Any, item: object, seconds: float = 0.0, mode: str = "ok") -> object:
    """The same, keeping a failure for the window: a repeat gets the failure."""
    return _work(self, item, seconds, mode)


@singleton_task(
    app=app, bind=True, key=["item"], idempotency={"key_from": "request_id", "window": 1}
)
def charge_brief(self: Any, item: object, request_id: str) -> object:
    """Its key is an argument, kept for one second."""
    return _work(self, item, 0.0, "ok")


@singleton_task(
    app=app,
    base=KillAfterSuccess,
    bind=True,
    key=["item"],
    acks_late=True,
    reject_on_worker_lost=True,
    idempotency=True,
)
def charge_durable(self: Any, item: object) -> object:
    """acks_late: its child dies after the success is stored, so the message comes again."""
    return _work(self, item, 0.0, "ok")


@singleton_task(app=app, bind=True, key=["item"], history=True, idempotency=True)
def charge_chronicled(self: Any, item: object) -> object:
    """Idempotency keys on a lock that keeps its history."""
    return _work(self, item, 0.0, "ok")


@singleton_task(app=app, bind=True, key=["item"], idempotency=True, on_contention=wait(timeout=20))
def charge_waiting(self: Any, item: object, seconds: float = 0.0) -> object:
    """A copy waits for the push wake-up: it starts the moment the holder lets go."""
    return _work(self, item, seconds, "ok")


@singleton_task(app=app, bind=True, key=["item"], lock="while_executing", idempotency=True)
def charge_unheld(self: Any, item: object) -> object:
    """No hold at dispatch (runs still never overlap): the key alone answers repeats."""
    return _work(self, item, 0.0, "ok")
