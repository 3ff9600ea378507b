"""The broker ride: every dependence on kombu's and Celery's Redis internals, installed per app.

On a Redis broker that is also the lock store's server, lock operations ride the round
trips Celery makes anyway. Whatever subclasses, overrides or writes the layout of kombu's
or Celery's Redis internals to do so lives here (docs/design.md lists the submodules).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kombu.connection import Connection

from . import results, versions
from .connection import for_app, publishing, ride_of_app, turned_off
from .results import BACKEND, SENTINEL_BACKEND, RedisBackend, SentinelBackend
from .state import Purges, Receipts
from .transport import SENTINEL_TRANSPORT, TRANSPORT, RedisTransport, SentinelTransport

if TYPE_CHECKING:
    from celery import Celery


def install(app: Celery) -> bool:
    """Make ``app`` ride: its Redis broker connections use ``RedisTransport`` (or
    ``SentinelTransport``), its Redis result backends ``RedisBackend`` (or
    ``SentinelBackend``). False, with one WARNING per process, when the installed kombu
    or Celery is outside ``versions.TESTED``: nothing is installed, and every lock
    operation then takes its own round trip. Installing again keeps what the app's ride
    was told.

    The one switch: the task binding calls it when ``singleton_lock_ride_broker`` is True
    (the default), and ``uninstall(app)`` when it is False. It changes that app alone: its
    connection class (``app.amqp.Connection``, a subclass of its own that keeps the app's
    ride) and its loader's result-backend aliases. A worker whose kombu reads otherwise
    than the ride writes turns it off for itself (``selfcheck``); producers keep riding,
    and the workers that agree sweep their notes."""
    reason = versions.outside()
    if reason is not None:
        versions.warn_once(reason)
        return False
    amqp = app.amqp
    if amqp.Connection is Connection:  # kombu's own: a class the app set itself is kept
        amqp.Connection = for_app()
    results.install(app)
    return True


def uninstall(app: Celery) -> None:
    """Undo ``install``: ``app`` uses kombu's and Celery's own classes again (for what it
    connects and builds from now on)."""
    amqp = app.amqp
    if ride_of_app(app) is not None and "Connection" in vars(amqp):
        del amqp.Connection  # the class's own: kombu's Connection
    results.uninstall(app)


def installed(app: Celery) -> bool:
    """Whether ``app`` rides (``install`` took)."""
    return ride_of_app(app) is not None


def on_receipt(app: Celery, receipts: Receipts | None) -> None:
    """Have each message ``app`` receives in this process offer what rides kombu's
    unacked bookkeeping for it, given its headers, the broker's server and its delivery
    tag (the worker's main process; None: no more). Nothing when ``app`` does not ride."""
    ride = ride_of_app(app)
    if ride is not None:
        ride.receipts = receipts


def on_purge(app: Celery, purges: Purges) -> None:
    """Have a purge on ``app``'s broker tell ``purges`` the purging channel's client and
    the lists it emptied (their messages' holds are given up, not kept for ``queue_ttl``)."""
    ride = ride_of_app(app)
    if ride is not None:
        ride.purges = purges


def turn_off(app: Celery, reason: str) -> None:
    """From now on nothing of ``app`` rides in this process: every lock operation takes
    its own round trip, every message is put as kombu puts it."""
    ride = ride_of_app(app)
    if ride is not None:
        ride.turned_off = reason


__all__ = [
    "BACKEND",
    "SENTINEL_BACKEND",
    "SENTINEL_TRANSPORT",
    "TRANSPORT",
    "RedisBackend",
    "RedisTransport",
    "SentinelBackend",
    "SentinelTransport",
    "install",
    "installed",
    "on_purge",
    "on_receipt",
    "publishing",
    "ride_of_app",
    "turn_off",
    "turned_off",
    "uninstall",
]
