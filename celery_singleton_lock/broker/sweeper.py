"""Messages lost in transit, found on the worker's timer and pushed again (``Sweeper``).

A singleton message pushed with its hold is noted in transit (``broker.transit``) until a
worker records it as unacked (``unacked.QoS`` clears the note in that pipeline). Workers
sweep the notes and push again a message lost in between, which kombu's transport loses.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

from ..config.stores import LockStores
from ..exceptions import SingletonLockError
from . import versions
from .connection import turned_off
from .transit import Transit

if TYPE_CHECKING:
    from celery import Celery

logger = logging.getLogger(__name__)

# kombu's default name of the Redis broker's unacked hash (its ``unacked_key`` option).
UNACKED_KEY = "unacked"


class Sweeper:
    """Every ``interval`` s on the worker's timer: the notes swept on a connection of
    its own to the broker (``broker.transit.Transit.sweep``), each hold asked of the lock store.

    A message popped by a worker killed before it recorded it as unacked is pushed again
    ``singleton_lock_transit_timeout`` (``wait``) to twice that after it went missing,
    where kombu's Redis transport loses it for good."""

    def __init__(self, app: Celery, wait: float) -> None:
        self.app = app
        self.wait = wait
        self.interval = max(0.5, wait / 2)
        options = app.conf.broker_transport_options or {}
        # As the server names it: kombu prefixes every key with global_keyprefix.
        self.unacked = str(options.get("global_keyprefix") or "") + str(
            options.get("unacked_key") or UNACKED_KEY
        )
        self.connection: Any = None

    @classmethod
    def of(cls, app: Celery) -> Sweeper | None:
        """A worker's sweeper; None when nothing is noted (``transit_timeout = 0``,
        ``ride_broker = False``, a broker that is not Redis), or kombu is a release the
        ride is not tested on or reads otherwise than the ride writes (the sweep reads
        kombu's unacked bookkeeping)."""
        config = LockStores.for_app(app).config
        if config.transit_timeout <= 0 or not config.ride_broker:
            return None
        if not versions.TESTED_HERE or turned_off(app) is not None:
            return None
        with app.connection_for_write() as connection:  # no I/O: the transport it would use
            if connection.transport.driver_type != "redis":
                return None
        return cls(app, config.transit_timeout)

    def __call__(self) -> None:
        stores = LockStores.for_app(self.app)
        store = stores.lock
        if self.connection is None:
            self.connection = self.app.connection_for_write()
        connection = self.connection
        try:
            notes = Transit(connection.default_channel.client, stores.config.prefix)
            again = notes.sweep(
                self.unacked,
                # A message without a hold of its own (limit, rate) is owed its run as is.
                lambda name, token: not name or store.holder(name) == token,
                wait=self.wait,
            )
        except (SingletonLockError, *connection.connection_errors) as error:
            logger.debug("sweep of messages in transit skipped: %s", error)
            with contextlib.suppress(Exception):
                connection.collect()  # a fresh channel at the next tick
            return
        for tag in again:
            logger.warning(
                "celery-singleton-lock: message %s was lost between the broker and a worker "
                "(taken off the queue, never recorded as unacked): pushed again",
                tag,
            )

    def close(self) -> None:
        if self.connection is not None:
            with contextlib.suppress(Exception):
                self.connection.release()
            self.connection = None
