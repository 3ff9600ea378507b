"""What a worker checks as it starts: settings that stop it, settings that defeat the lock."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..broker import installed, selfcheck, turn_off, turned_off, versions
from ..broker.pushes import pushes_of
from ..broker.results import missed_ride as missed_result_ride
from ..broker.transport import missed_ride
from ..config.incumbents import foreign_settings
from ..config.options import is_singleton
from ..config.spelling import in_users_words
from ..config.visibility import (
    NATIVE_DELAY,
    RABBITMQ_TRANSPORTS,
    transport_of,
    visibility_timeout,
)
from ..exceptions import ConfigurationError, SingletonLockError
from ..policies import longest_requeue
from ..signals import ride_checked

if TYPE_CHECKING:
    from celery import Celery, Task


# The lock name of the script a worker runs as it starts (a release of a token no call has).
START_CHECK = "celery-singleton-lock-start-check"


def singleton_tasks(app: Celery) -> list[Task]:
    """The app's singleton tasks (``SingletonTask`` subclasses, as Celery holds them)."""
    return [task for task in app.tasks.values() if is_singleton(task)]


def refuse_bad_settings(app: Celery) -> None:
    """Raise ``SystemExit`` with one line naming the setting, before the worker consumes.

    A worker that started anyway would report ready and then fail every singleton task.
    """
    tasks = singleton_tasks(app)
    if not tasks:
        return
    try:
        store = tasks[0].singleton_context.store  # reads the settings, builds the client
        # One script, which releases nothing: a server that runs none (Valkey without its
        # Lua engine), a refused user or a replica stops the worker here, not every task.
        store.release_token(START_CHECK, START_CHECK)
    except ConfigurationError as error:
        raise SystemExit(f"celery-singleton-lock: {error}") from None
    except SingletonLockError:
        pass  # unreachable now: an outage, which the task's policy answers when it comes


def check_worker_setup(app: Celery) -> list[str]:
    """Settings that can defeat the lock, as warnings (logged once at worker start)."""
    tasks = singleton_tasks(app)
    if not tasks:
        return []
    # celery-once's ONCE, celery-singleton's singleton_*: ported settings that do nothing.
    warnings: list[str] = foreign_settings(app.conf)
    store = tasks[0].singleton_context.stores
    try:
        value = store.eviction_policy()
    except SingletonLockError as error:
        warnings.append(f"could not check the lock store at start ({error})")
        value = None
    if value and value != "noeviction":
        warnings.append(
            f"the lock store at {store.describe()} has maxmemory-policy={value}: under memory "
            "pressure Redis may evict lock keys and let a duplicate run. Set maxmemory-policy "
            "noeviction there, or give the locks a Redis of their own (singleton_lock_url)"
        )
    # Outside the tested releases nothing rides, as the WARNING at binding said.
    pushes = pushes_of(tasks[0].singleton_context.store) if versions.TESTED_HERE else None
    ride = tasks[0].singleton_context.stores.config.ride_broker
    for missed_by in (missed_ride, missed_result_ride):
        missed = None if pushes is None else missed_by(app, pushes.server, enabled=ride)
        if missed:
            warnings.append(missed)
    warnings += _unacked_too_long(app, tasks)
    warnings += _delayed_in_the_worker(app)
    # Our settings as the app writes them (``CELERY_SINGLETON_LOCK_URL`` under Django).
    return [in_users_words(warning, app.conf) for warning in warnings]


def _unacked_too_long(app: Celery, tasks: list[Task]) -> list[str]:
    """Tasks whose messages can wait unacked longer than the broker allows: Redis (and
    SQS) hand them out again after ``visibility_timeout``, RabbitMQ closes the channel
    after its ``consumer_timeout`` and delivers again all it held."""
    timeout = visibility_timeout(
        app.conf, tasks[0].singleton_context.stores.config.consumer_timeout
    )
    if timeout is None:
        return []
    rabbitmq = transport_of(app.conf) in RABBITMQ_TRANSPORTS
    named = "consumer_timeout" if rabbitmq else "visibility_timeout"
    raise_it = (
        "raise the server's consumer_timeout (and singleton_lock_consumer_timeout with it)"
        if rabbitmq
        else "raise visibility_timeout (broker_transport_options)"
    )
    warnings = []
    for task in tasks:
        limit = task.time_limit or app.conf.task_time_limit
        # Only a late ack keeps a running task's message unacked; an early one is acked
        # as the run starts.
        if task.acks_late and limit and limit >= timeout:
            warnings.append(
                f"{task.name}: time_limit={limit}s with acks_late is not below the broker's "
                f"{named}={timeout}s, so a running task can be redelivered; the lock keeps "
                "the copy from running alongside (it is requeued) but it runs again "
                f"afterwards. {raise_it[0].upper()}{raise_it[1:]} above the time limit"
            )
        cap = longest_requeue(task.singleton_options().on_contention)
        if cap is not None and cap >= timeout:
            # A requeued call waits out its countdown unacked in the worker that received it.
            warnings.append(
                f"{task.name}: on_contention requeues with countdowns up to {cap}s, not below "
                f"the broker's {named}={timeout}s, so a requeued call can be handed out "
                "twice; its copy is dropped, after a round of contention. Write "
                f"requeue(cap=...) below {timeout}, or {raise_it}"
            )
    return warnings


def _delayed_in_the_worker(app: Celery) -> list[str]:
    """Quorum queues whose countdowns Celery cannot send through RabbitMQ's delay exchanges
    (a direct exchange): every delay of the library's (a requeue's backoff, a rate's slot,
    a debounce, a long countdown's hops) then waits unacked in a worker's prefetch."""
    if transport_of(app.conf) not in RABBITMQ_TRANSPORTS or not NATIVE_DELAY:
        return []  # (before Celery 5.5 no queue is delayed natively: nothing to change)
    warnings = []
    for name, queue in app.amqp.queues.items():
        quorum = (queue.queue_arguments or {}).get("x-queue-type") == "quorum"
        exchange = queue.exchange
        if quorum and exchange is not None and exchange.type == "direct":
            warnings.append(
                f"the quorum queue {name!r} is bound to the direct exchange "
                f"{exchange.name!r}: Celery cannot delay its messages natively, so each "
                "countdown (a requeue's backoff, a rate's slot, a debounce) waits in a "
                "worker, unacked, holding a place of its prefetch. Write "
                "task_default_exchange_type='topic' (or a topic exchange in task_queues)"
            )
    return warnings


def check_the_ride(app: Celery) -> tuple[int, str] | None:
    """The broker ride's self-check (``broker.selfcheck``), before the worker consumes and
    its pool forks: where kombu reads otherwise than the ride writes, the ride is turned
    off in this process. What to log, at which level (None: nothing to say)."""
    tasks = singleton_tasks(app)
    if not tasks or not installed(app) or turned_off(app) is not None:
        return None
    context = tasks[0].singleton_context
    try:
        differed = selfcheck.differences(app, context.stores.config.prefix)
        refused = None
        if differed is None:
            refused = selfcheck.push_refused(app, context.store, context.stores.config.prefix)
    except Exception as error:
        ride_checked.send(sender=app, outcome="not-run")
        return logging.WARNING, f"the broker ride's self-check could not run at start ({error})"
    outcome = "off" if differed is not None else "push-refused" if refused else "passed"
    ride_checked.send(sender=app, outcome=outcome)
    if differed is None:
        if refused is not None:
            return logging.WARNING, (
                "the broker ride's self-check: the lock store's user may not push to the "
                f"broker's queues, or use their database ({refused}). A dispatch's hold "
                "is taken apart from its message (a round trip of its own); allow that user "
                "the queues' keys and their database (Valkey 9.1's per-database ACL) to "
                "have it ride the push"
            )
        return logging.INFO, "the broker ride's self-check passed: kombu reads what it writes"
    turn_off(app, differed)
    return logging.ERROR, (
        f"the broker ride is off in this worker: {differed} (kombu {versions.installed('kombu')}). "
        "Every lock operation takes a round trip of its own: correct, a little slower. "
        "Report it to celery-singleton-lock with this line"
    )
