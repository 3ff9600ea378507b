"""The longest countdown a message may wait out in a worker before its broker hands it out again.

A Redis or SQS broker gives a message out again once it has been unacked for its
``visibility_timeout``, and a countdown is waited out unacked in the worker: it would run
twice. The waits the library chooses (a rate's slot, a paused key's resume) go in hops.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lease.redis.urls import first_url

if TYPE_CHECKING:
    from celery import Celery
    from celery.app.utils import Settings

# kombu's own defaults, by transport (its channels'); the transport option
# ``visibility_timeout`` sets it.
VISIBILITY_DEFAULTS = {
    "redis": 3600.0,
    "rediss": 3600.0,
    "sentinel": 3600.0,
    "sqs": 1800.0,
    "slmq": 1800.0,
    "pgmq": 1800.0,
}
# RabbitMQ closes the channel of a consumer that holds a delivery unacked longer than
# its ``consumer_timeout`` (30 minutes by default, a server setting no client can read:
# ``singleton_lock_consumer_timeout`` says what the server's is), and every message the
# worker held is delivered again.
CONSUMER_TIMEOUT = 1800.0
RABBITMQ_TRANSPORTS = ("amqp", "amqps", "pyamqp", "librabbitmq")
# Celery 5.5+ sends a countdown on a quorum queue through RabbitMQ's delay exchanges
# (native delayed delivery), where it waits in the broker, not in a worker; None before.
try:
    from celery.utils.quorum_queues import detect_quorum_queues
except ImportError:  # pragma: no cover  (Celery 5.3 and 5.4)
    detect_quorum_queues = None
NATIVE_DELAY = detect_quorum_queues is not None
# One hop waits at most this share of the timeout: a message is received a little after
# it is sent, and the producer's clock (which sets the ETA) is not the worker's.
HOP_SHARE = 0.5


def transport_of(conf: Settings) -> str:
    """The broker transport workers consume from: ``broker_transport`` if set, else the
    scheme of ``broker_read_url`` / ``broker_url`` (the first of a failover list); Celery's
    default, amqp, without either."""
    named = conf.get("broker_transport")
    if isinstance(named, str) and named:
        return named.lower()
    url = conf.get("broker_read_url") or conf.get("broker_url") or "amqp://"
    return first_url(url).partition("://")[0].lower().split("+")[0] or "amqp"


def visibility_timeout(conf: Settings, consumer_timeout: float = CONSUMER_TIMEOUT) -> float | None:
    """How long the broker lets a message stay unacked (seconds): its
    ``visibility_timeout``, or on RabbitMQ ``consumer_timeout`` (the server's, as
    ``singleton_lock_consumer_timeout`` gives it; 0: the server has none); None for a
    broker with neither, or a timeout of 0 or less (every unacked message is handed out
    again at once: no hop is short enough)."""
    transport = transport_of(conf)
    if transport in RABBITMQ_TRANSPORTS:
        return consumer_timeout if consumer_timeout > 0 else None
    default = VISIBILITY_DEFAULTS.get(transport)
    if default is None:
        return None
    given = (conf.get("broker_transport_options") or {}).get("visibility_timeout")
    try:
        seconds = float(given) if given is not None else default
    except (TypeError, ValueError):
        return default  # not a number: kombu's own reading of it fails, not ours
    return seconds if seconds > 0 else None


def longest_countdown(conf: Settings, consumer_timeout: float = CONSUMER_TIMEOUT) -> float | None:
    """How long one hop of a wait may be on this app's broker (None: as long as it likes)."""
    seconds = visibility_timeout(conf, consumer_timeout)
    return None if seconds is None else seconds * HOP_SHARE


def has_quorum_queues(app: Celery) -> bool:
    """Whether ``app`` sends to a RabbitMQ quorum queue with a Celery that delays its
    countdowns natively (Celery's own test, as its ``send_task`` makes it)."""
    if detect_quorum_queues is None:
        return False
    driver = app.producer_pool.connections.connection.transport.driver_type
    return bool(detect_quorum_queues(app, driver)[0])
