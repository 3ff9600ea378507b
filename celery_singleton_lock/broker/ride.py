"""What the core asks of the broker ride (``LockRide``), chosen once an app.

The core asks ``lock_ride(app)`` for a held call's publish (or a replacing call's), a
received message's take and a run's release: ``BrokerRide`` where the app rides, else (the
ride off, kombu outside the tested range) ``NoRide``, each a round trip of its own.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Protocol

from ..config.stores import LockStores
from ..outages import release_or_warn
from . import versions
from .attached import release_asking
from .held_push import replace_riding, send_riding
from .pushes import Pushes, RidingTake, pushes_of
from .results import release_with_result
from .transport import may_ride

if TYPE_CHECKING:
    from celery import Celery, Task
    from celery.app.task import Context
    from celery.result import AsyncResult

    from ..context import TaskContext
    from ..lease import Contended, Lease, Server, TakeOver
    from ..lease.history import Record
    from ..modes.stages import Replacing
    from .state import HeldCall


class LockRide(Protocol):
    """What the core asks of the ride: each answer rides a round trip the broker or the
    result backend makes anyway, or says the lock store's own call is the way."""

    def pushes_for(self, context: TaskContext) -> Pushes | None:
        """The pushes a held call of the task's may ride (its channel decides at the
        push), asked once per task (``publish.call.TaskFacts``); None: none does."""

    def publish_held(self, call: HeldCall, *, swaps: bool) -> AsyncResult | Contended | None:
        """Publish ``call`` with its hold taken in its message's push: its result, or
        ``Contended`` (refused, nothing sent; ``swaps``: a refused call's answer is a
        swap, no read answered it first). None: it does not ride, and its hold takes a
        round trip of its own (``publish.dispatch.Gate``)."""

    def replace_held(self, call: HeldCall, replacing: Replacing) -> Lease | Contended | None:
        """Publish a refused ``call``'s successor of the queued call with the swap of
        that call's hold in its push: the new hold, or ``Contended`` (the queued call
        changed; nothing sent). None: the swap takes a round trip of its own."""

    def take_on_receipt(
        self,
        context: TaskContext,
        server: Server,
        name: str,
        *,
        token: str,
        take: TakeOver,
        entry: Record | None,
    ) -> RidingTake | None:
        """The take of a message being received, to ride the pipeline that records it
        as unacked on ``server``; None: the reservation takes on its own round trip."""

    def release_at_end(
        self, task: Task, request: Context, context: TaskContext, lease: Lease, *, ride: bool
    ) -> None:
        """A run's lease at its end: with its result's write, or sent now; eagerly, waited
        for. ``ride=False``: sent now (the result is written already). The lock's
        history, if kept, records it there too."""


class NoRide:
    """Nothing rides: each lock operation is the lock store's own call."""

    def pushes_for(self, context: TaskContext) -> Pushes | None:
        return None

    def publish_held(self, call: HeldCall, *, swaps: bool) -> AsyncResult | Contended | None:
        return None

    def replace_held(self, call: HeldCall, replacing: Replacing) -> Lease | Contended | None:
        return None

    def take_on_receipt(
        self,
        context: TaskContext,
        server: Server,
        name: str,
        *,
        token: str,
        take: TakeOver,
        entry: Record | None,
    ) -> RidingTake | None:
        return None

    def release_at_end(
        self, task: Task, request: Context, context: TaskContext, lease: Lease, *, ride: bool
    ) -> None:
        store = context.store
        # Another holder by then: the lease was lost; nobody: it had expired.
        ended = "cancelled" if lease.cancelled else "released"
        record = context.record(lease.name, request.id, release=(ended, "lost", "expired"))
        if request.is_eager:
            release_or_warn(partial(store.release, entry=record), lease)
        elif ride and self.released_with_result(task, request, context, lease, record):
            return
        elif not release_asking(task, request, lease, record):  # asked, where its end looks
            release_or_warn(partial(store.release_nowait, entry=record), lease)

    def released_with_result(
        self, task: Task, request: Context, context: TaskContext, lease: Lease, entry: Record | None
    ) -> bool:
        """Whether ``lease``'s release rides the write of ``request``'s result: never."""
        return False


class BrokerRide(NoRide):
    """An app that rides (``broker.install``): an operation rides where the lock store is
    the broker's (or the result backend's) server, else it is the store's own call."""

    def pushes_for(self, context: TaskContext) -> Pushes | None:
        """A broker on another server pushes no hold (said by its URL, before a producer
        is taken to ask its channel)."""
        pushes = pushes_of(context.store)
        if pushes is None:
            return None
        return pushes if may_ride(context.stores.config.broker_url, pushes.server) else None

    def publish_held(self, call: HeldCall, *, swaps: bool) -> AsyncResult | Contended | None:
        """Rides where the task's holds may (``pushes_for``) and Celery publishes the call
        through the app's producer; its channel then says whether it pushes to the lock
        store's server (``held_push.send_riding``)."""
        pushes = call.pushes
        call.rides = pushes is not None and call.through_producer()
        if pushes is None or not call.rides:
            return None
        return send_riding(call, pushes, swaps)

    def replace_held(self, call: HeldCall, replacing: Replacing) -> Lease | Contended | None:
        """Rides where the refused call's own publish did (``held_push.replace_riding``)."""
        pushes = call.pushes
        if pushes is None or not call.rides:
            return None
        return replace_riding(call, pushes, replacing)

    def take_on_receipt(
        self,
        context: TaskContext,
        server: Server,
        name: str,
        *,
        token: str,
        take: TakeOver,
        entry: Record | None,
    ) -> RidingTake | None:
        """Rides where the lock store is ``server`` as the same ACL user."""
        pushes = pushes_of(context.store)
        if pushes is None or not pushes.server.same_user(server):
            return None
        return pushes.riding_take(name, context.ttl, token=token, take=take, entry=entry)

    def released_with_result(
        self, task: Task, request: Context, context: TaskContext, lease: Lease, entry: Record | None
    ) -> bool:
        """Whether ``lease``'s release rides the write of ``request``'s result
        (``results.release_with_result``)."""
        return release_with_result(task, request, context, lease, entry)


# Stateless: what an app rides is in its own ``AppRide``; these only choose the way.
NO_RIDE = NoRide()
BROKER_RIDE = BrokerRide()


def lock_ride(app: Celery) -> LockRide:
    """The way ``app``'s lock operations go: ``BrokerRide`` where ``broker.install`` takes
    (``singleton_lock_ride_broker`` on, kombu and Celery inside ``versions.TESTED``), else
    ``NoRide``. Both are fixed for the process and the app's settings: chosen once."""
    if not versions.TESTED_HERE or not LockStores.for_app(app).config.ride_broker:
        return NO_RIDE
    return BROKER_RIDE


__all__ = ["BROKER_RIDE", "NO_RIDE", "BrokerRide", "LockRide", "NoRide", "lock_ride"]
