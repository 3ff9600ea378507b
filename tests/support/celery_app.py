"""The Celery app the lifecycle tests run in real worker processes.

Configured from the environment so one module serves every worker the tests start:
``CSL_BROKER_URL`` (broker, and result backend unless ``CSL_RESULT_URL``),
``CSL_LOCK_URL`` (the lock store, a separate server so tests can take it down alone),
``CSL_CHECK_URL`` (where executions are recorded, outside the lock store),
``CSL_VISIBILITY_TIMEOUT``, ``CSL_RIDE`` (0: kombu's own transport),
``CSL_TRANSIT_TIMEOUT``, ``CSL_KEYPREFIX`` (kombu's ``global_keyprefix``),
``CSL_PUBLISHED`` and ``CSL_GATED_FOLLOW`` (below),
``CSL_CONSUMER_TIMEOUT`` (a RabbitMQ broker's, as the app says it is), ``CSL_THROTTLE``
(the ``throttled`` task's window), ``CSL_DIES_SENDING`` (below), and the rest read below.
Every environment variable the test app reads is read in this module.

The tasks live in ``tests/support/tasks/``, one module per subject (``records``: what
they write on the checker, ``runs`` and ``started``), and are registered here under this
module's name, ``tests.support.celery_app.<function>``, as the tests and workers call them.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from celery import Celery
from celery.signals import after_task_publish, before_task_publish

from celery_singleton_lock.tokens import ATTEMPT_HEADER, RETRY_OF_HEADER

TASKS = "tests.support.tasks"


class App(Celery):  # type: ignore[misc]  (Celery is untyped)
    """Names a task defined in ``tests/support/tasks/`` as if it were defined in this
    module (Celery's documented hook): the names the tests, the workers and the lock
    names use, ``tests.support.celery_app.<function>``, whatever its subject module."""

    def gen_task_name(self, name: str, module: str) -> str:
        if module == TASKS or module.startswith(f"{TASKS}."):
            module = __name__
        return str(super().gen_task_name(name, module))


def task_name(function: str) -> str:
    """The name of the test task defined as ``function`` (or named so explicitly)."""
    return f"{__name__}.{function}"


app = App(__name__)
app.conf.update(
    task_default_queue=os.environ.get("CSL_QUEUE", "celery"),
    broker_url=os.environ.get("CSL_BROKER_URL", "redis://127.0.0.1:6379/0"),
    result_backend=os.environ.get("CSL_RESULT_URL")
    or os.environ.get("CSL_BROKER_URL", "redis://127.0.0.1:6379/0"),
    # CSL_LOCK_URL="" leaves the lock store to be found from the backend or broker.
    singleton_lock_url=os.environ.get("CSL_LOCK_URL", "redis://127.0.0.1:6379/0") or None,
    # CSL_LOCK_PREFIX: a worker whose locks (and attached calls) no other test's see.
    singleton_lock_prefix=os.environ.get("CSL_LOCK_PREFIX", "t"),
    # CSL_ATTACH_SWEEP: seconds between a worker's sweeps of attached calls.
    singleton_lock_attach_sweep=float(os.environ.get("CSL_ATTACH_SWEEP", "0.5")),
    # The metrics tests have a worker serve Prometheus metrics (CSL_METRICS_PORT).
    singleton_lock_metrics_port=int(os.environ["CSL_METRICS_PORT"])
    if os.environ.get("CSL_METRICS_PORT")
    else None,
    # The events tests have a worker send task events, as -E does (CSL_TASK_EVENTS=1).
    worker_send_task_events=os.environ.get("CSL_TASK_EVENTS") == "1",
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


def check_url() -> str:
    """Where the test tasks record their executions (the checker's Redis)."""
    return os.environ.get("CSL_CHECK_URL", "redis://127.0.0.1:6379/1")


# The ``throttled`` task's window (CSL_THROTTLE, seconds).
THROTTLE = float(os.environ.get("CSL_THROTTLE", "1.5"))

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

# With CSL_OTEL_SPANS=<path> (a worker's), each pool process traces its runs as
# opentelemetry-instrumentation-celery does, its spans written to that file.
if os.environ.get("CSL_OTEL_SPANS"):
    from .spans import export_spans_to

    export_spans_to(os.environ["CSL_OTEL_SPANS"])


# The tasks, one module per subject, registered on ``app`` as they are imported. After
# the configuration above, which they read; imported here so ``-A tests.support.celery_app``
# finds every one, and ``celery_app.work`` still names the task.
from .tasks.attach import GATED, collect, errback, follow, gated_follow, published  # noqa: E402
from .tasks.cancel import CancelHooked, preview, preview_hard, preview_retrying  # noqa: E402
from .tasks.chaos import (  # noqa: E402
    FENCED_WRITE,
    WRITER,
    cut_off_writer,
    fenced_write,
    fenced_writer,
    swarm,
)
from .tasks.contention import (  # noqa: E402
    callback_request,
    exclusive_fail,
    exclusive_skip,
    exclusive_wait_fail,
    exclusive_wait_skip,
    impatient,
    patient,
    process_request,
    strict,
)
from .tasks.history import (  # noqa: E402
    chronicled,
    chronicled_cancel,
    chronicled_custom,
    chronicled_latest,
    chronicled_limited,
    chronicled_patient,
    chronicled_pending,
    chronicled_rated,
    chronicled_strict,
)
from .tasks.idempotency import (  # noqa: E402
    KillAfterSuccess,
    charge,
    charge_brief,
    charge_chronicled,
    charge_durable,
    charge_kept,
    charge_unheld,
    charge_waiting,
)
from .tasks.lifecycle import (  # noqa: E402
    durable,
    durable_limited,
    flaky,
    limited,
    noop,
    note_error,
    plain,
    work,
)
from .tasks.limits import (  # noqa: E402
    export,
    export_fair,
    export_fair_capped,
    export_fair_rated,
    export_one_total,
    export_total,
    export_waiting,
    export_weighted,
)
from .tasks.modes import (  # noqa: E402
    debounced,
    latest,
    latest_queued,
    refresh,
    refresh_waiting,
    reopened,
    throttled,
    throttled_closed,
    throttled_reopen,
    work_while_executing,
)
from .tasks.rates import (  # noqa: E402
    capped,
    capped_checked,
    capped_delayed,
    capped_soon,
    delayed,
    delayed_slowly,
    planned,
    rate_checked,
    rated,
    rated_pair,
    rated_slowly,
    rated_tokens,
    tenant_plan,
    tokens_of,
)
from .tasks.records import GATE_CLIENT, checker, checker_time, deaths  # noqa: E402
from .tasks.soak import SOAK_LIMIT, SOAK_MODES, SOAK_RATE, soak_plain, soak_tasks  # noqa: E402

# With CSL_PUBLISHED=1 (a worker's), what its processes publish through Celery's
# ``apply_async`` is recorded on the checker's ``published`` (``tasks.attach.published``).
# An after_ receiver: the dispatch's overlapped path stays on (DIES_SENDING says why).
if os.environ.get("CSL_PUBLISHED"):
    after_task_publish.connect(published)

# With CSL_GATED_FOLLOW=1 (a worker's), a run whose chain goes on to a ``follow`` tagged
# ``gated...`` stores its result only once the test opens that tag's gate
# (``tasks.attach.gated_follow``).
if os.environ.get("CSL_GATED_FOLLOW"):
    after_task_publish.connect(gated_follow)

__all__ = [
    "FENCED_WRITE", "GATED", "GATE_CLIENT", "SOAK_LIMIT", "SOAK_MODES", "SOAK_RATE", "THROTTLE",
    "WRITER",
    "App", "CancelHooked", "KillAfterSuccess", "app", "callback_request", "capped",
    "capped_checked", "capped_delayed", "capped_soon", "charge", "charge_brief",
    "charge_chronicled", "charge_durable", "charge_kept", "charge_unheld", "charge_waiting",
    "check_url", "checker", "checker_time", "chronicled", "chronicled_cancel", "chronicled_custom",
    "chronicled_latest", "chronicled_limited", "chronicled_patient", "chronicled_pending",
    "chronicled_rated", "chronicled_strict", "collect", "cut_off_writer", "deaths", "debounced",
    "delayed", "delayed_slowly", "durable", "durable_limited", "errback", "exclusive_fail",
    "exclusive_skip", "exclusive_wait_fail", "exclusive_wait_skip", "export", "export_fair",
    "export_fair_capped", "export_fair_rated", "export_one_total", "export_total",
    "export_waiting", "export_weighted",
    "fenced_write", "fenced_writer", "flaky", "follow", "gated_follow", "impatient", "latest",
    "latest_queued",
    "limited", "noop", "note_error", "patient", "plain", "planned", "preview", "preview_hard",
    "preview_retrying", "process_request", "published", "rate_checked", "rated", "rated_pair",
    "rated_slowly", "rated_tokens", "refresh", "refresh_waiting", "reopened", "soak_plain",
    "soak_tasks", "strict", "swarm", "task_name", "tenant_plan", "throttled", "throttled_closed",
    "throttled_reopen", "tokens_of", "work", "work_while_executing",
]  # fmt: skip
