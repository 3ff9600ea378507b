"""The same no-op task four ways: plain Celery, celery-singleton, celery-once and
celery-singleton-lock, in two Celery apps. Configured from the environment by run.py.

``others`` has plain Celery and the incumbents, with kombu's and Celery's own classes, as
their users run them; ``app`` has this project's tasks (an app with a singleton task
rides its Redis broker with this project's transport and result backend, so plain
Celery measured there would not be plain). Three configurations (``run.py --config``):
the locks where each library puts them by default on a Redis broker, the result
backend (``BENCH_RESULT_URL``, another database of the broker's server), results stored
(``default``); every system's locks in a dedicated Redis (``BENCH_LOCK_URL``) apart
from the broker, results ignored (``separate``); a RabbitMQ broker with locks and
results on a Redis (``rabbitmq``); each system's settings are in ``settings``. Executions
mark themselves in a Redis (``BENCH_MARKS_URL``, else the broker's: ``started:<system>``
and ``marks:<system>``) so the harness can time starts and ends. The dispatch sections
build each system alone in a process of its own instead (``alone``); ``plain`` there is
this module's, every system registered beside it.
"""

from __future__ import annotations

import time
from typing import Any

import redis
from celery import Celery
from celery_once import QueueOnce
from celery_singleton import Singleton

from benchmarks.settings import (
    BROKER,
    CELERY,
    CELERY_ONCE,
    CELERY_SINGLETON,
    MARKS,
    RESULTS,
    THIS,
)
from celery_singleton_lock import RateLimit, requeue, singleton_task, wait

others = Celery("bench-others", broker=BROKER, backend=RESULTS)
others.conf.update(CELERY, **CELERY_SINGLETON, **CELERY_ONCE)

app = Celery("bench", broker=BROKER, backend=RESULTS)
app.conf.update(CELERY, **THIS)

# Each side's app (``side``). Every task here is ``shared=False``:
# Celery adds a task to every app in the process by default, which would bind this
# project's tasks to ``others`` (and install its transport there).
APPS = {"others": others, "this": app}


def app_path(side: str) -> str:
    """``side``'s app as ``celery -A`` names it."""
    return f"{__name__}:{'app' if side == 'this' else 'others'}"


_marks: redis.Redis | None = None


def marks() -> redis.Redis:
    global _marks  # noqa: PLW0603  (one client per process, after fork)
    if _marks is None:
        _marks = redis.Redis.from_url(MARKS)
    return _marks


def _run(system: str, item: str, seconds: float) -> str:
    started = time.time()
    marks().rpush(f"started:{system}", f"{item}|{started}")
    if seconds:
        time.sleep(seconds)
    marks().rpush(f"marks:{system}", f"{item}|{started}|{time.time()}")
    return item


@others.task(shared=False, name="bench.plain")
def plain(item: str, seconds: float = 0.0) -> str:
    return _run("plain", item, seconds)


@others.task(shared=False, name="bench.celery_singleton", base=Singleton)
def celery_singleton(item: str, seconds: float = 0.0) -> str:
    return _run("celery_singleton", item, seconds)


@others.task(shared=False, name="bench.celery_once", base=QueueOnce, once={"graceful": True})
def celery_once(item: str, seconds: float = 0.0) -> str:
    return _run("celery_once", item, seconds)


@singleton_task(app=app, shared=False, name="bench.this")
def this(item: str, seconds: float = 0.0) -> str:
    return _run("this", item, seconds)


@singleton_task(
    app=app, shared=False, name="bench.this_wait", dedupe=False, on_contention=wait(timeout=60)
)
def this_wait(item: str, seconds: float = 0.0) -> str:
    return _run("this_wait", item, seconds)


@singleton_task(
    app=app,
    shared=False,
    name="bench.this_requeue",
    dedupe=False,
    on_contention=requeue(max_tries=10_000, backoff=0.01, cap=0.1),
)
def this_requeue(item: str, seconds: float = 0.0) -> str:
    return _run("this_requeue", item, seconds)


@singleton_task(app=app, shared=False, name="bench.this_until_executing", lock="until_executing")
def this_until_executing(item: str, seconds: float = 0.0) -> str:
    return _run("this_until_executing", item, seconds)


@singleton_task(app=app, shared=False, name="bench.this_throttle", throttle=60)
def this_throttle(item: str, seconds: float = 0.0) -> str:
    return _run("this_throttle", item, seconds)


@singleton_task(app=app, shared=False, name="bench.this_while_executing", lock="while_executing")
def this_while_executing(item: str, seconds: float = 0.0) -> str:
    return _run("this_while_executing", item, seconds)


@singleton_task(
    app=app, shared=False, name="bench.this_replace", lock="until_executing", on_duplicate="replace"
)
def this_replace(item: str, seconds: float = 0.0) -> str:
    return _run("this_replace", item, seconds)


@singleton_task(app=app, shared=False, name="bench.this_debounce", debounce=60)
def this_debounce(item: str, seconds: float = 0.0) -> str:
    return _run("this_debounce", item, seconds)


@singleton_task(app=app, shared=False, name="bench.this_limit", limit=3)
def this_limit(item: str, seconds: float = 0.0) -> str:
    return _run("this_limit", item, seconds)


# Section 12: two runs per tenant and two in all, the freed slots handed out round
# robin across tenants (the default), or first come, first served with runs waiting in
# the pool (``wait``: today's way before round robin).
@singleton_task(
    app=app, shared=False, name="bench.this_fair", key="t:{tenant}", limit=2, total_limit=2
)
def this_fair(tenant: str, seconds: float = 0.0) -> str:
    return _run("this_fair", tenant, seconds)


@singleton_task(
    app=app,
    shared=False,
    name="bench.this_fair_first",
    key="t:{tenant}",
    limit=2,
    total_limit=2,
    total_order="first_come",
    on_contention=wait(timeout=120),
)
def this_fair_first(tenant: str, seconds: float = 0.0) -> str:
    return _run("this_fair_first", tenant, seconds)


@singleton_task(app=app, shared=False, name="bench.this_rate", rate="100/s")
def this_rate(item: str, seconds: float = 0.0) -> str:
    return _run("this_rate", item, seconds)


@singleton_task(
    app=app, shared=False, name="bench.this_rate_delay", rate="100/s", on_limited="delay"
)
def this_rate_delay(item: str, seconds: float = 0.0) -> str:
    return _run("this_rate_delay", item, seconds)


def _tokens(item: str, seconds: float = 0.0) -> int:
    """A cost of the call's arguments, as a token count would be."""
    return len(item)


@singleton_task(
    app=app,
    shared=False,
    name="bench.this_rates",
    rate=["100/s", RateLimit("100000/m", burst=1000, cost=_tokens)],
)
def this_rates(item: str, seconds: float = 0.0) -> str:
    """Two limits and a cost per call: one script asks both."""
    return _run("this_rates", item, seconds)


@singleton_task(app=app, shared=False, name="bench.this_cancel", on_duplicate="cancel")
def this_cancel(item: str, seconds: float = 0.0) -> str:
    return _run("this_cancel", item, seconds)


@singleton_task(app=app, shared=False, name="bench.this_history", history=True)
def this_history(item: str, seconds: float = 0.0) -> str:
    return _run("this_history", item, seconds)


# Canvas members (section 11): a step whose duplicates a canvas repeats, a link after
# it and a chord's body; results stored whatever the configuration (chords need them).
@others.task(shared=False, name="bench.plain_step", ignore_result=False)
def plain_step(item: str, seconds: float = 0.0) -> str:
    return _run("plain_step", item, seconds)


@others.task(shared=False, name="bench.plain_then", ignore_result=False)
def plain_then(previous: str, number: int) -> str:
    return f"{previous}/{number}"


@others.task(shared=False, name="bench.plain_collect", ignore_result=False)
def plain_collect(results: list[str]) -> int:
    return len(results)


@singleton_task(app=app, shared=False, name="bench.this_step", ignore_result=False)
def this_step(item: str, seconds: float = 0.0) -> str:
    return _run("this_step", item, seconds)


@app.task(shared=False, name="bench.this_then", ignore_result=False)
def this_then(previous: str, number: int) -> str:
    return f"{previous}/{number}"


@app.task(shared=False, name="bench.this_collect", ignore_result=False)
def this_collect(results: list[str]) -> int:
    return len(results)


# Each system's (step, link, chord body).
CANVAS: dict[str, tuple[Any, Any, Any]] = {
    "plain": (plain_step, plain_then, plain_collect),
    "this": (this_step, this_then, this_collect),
}


class Idempotent:
    """``this`` called with an idempotency key per item: a unique call claims a new key; a
    repeat is answered from its key's record with the first call's result (nothing sent)."""

    name = "bench.this_idempotent"

    def apply_async(self, args: tuple[str, ...], **options: Any) -> Any:
        return this.apply_async(args, idempotency_key=f"idem-{args[0]}", **options)


SYSTEMS: dict[str, Any] = {
    "plain": plain,
    "celery_singleton": celery_singleton,
    "celery_once": celery_once,
    "this": this,
    "this_until_executing": this_until_executing,
    "this_throttle": this_throttle,
    "this_while_executing": this_while_executing,
    "this_replace": this_replace,
    "this_debounce": this_debounce,
    "this_limit": this_limit,
    "this_fair": this_fair,
    "this_fair_first": this_fair_first,
    "this_rate": this_rate,
    "this_rate_delay": this_rate_delay,
    "this_rates": this_rates,
    "this_cancel": this_cancel,
    "this_history": this_history,
    "this_idempotent": Idempotent(),
}


def side(system: str) -> str:
    """Which app runs ``system``: "others" (plain Celery, the incumbents) or "this"."""
    return "this" if system.startswith("this") else "others"
