"""A dispatch's lock operations riding its message's push: its hold, or a replacing call's swap.

Where the lock store is the broker's Redis server (``pushes_of``), the script that pushes
the message takes them: one round trip, the one plain Celery makes; a duplicate pushes nothing,
and there is never a hold without its message (elsewhere: ``PushedHold``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..broker.connection import publishing
from ..broker.pushes import Push, Pushes, PushRefused
from ..broker.transport import rides
from ..exceptions import LockStoreUnavailableError
from ..lease import HOLD, Contended, Lease, LockStore, Server
from ..modes.base import Mode, Publish, Replacing
from ..outages import release_or_warn
from ..tokens import NAME_HEADER
from .dispatch import Refused, Sent, refusals

if TYPE_CHECKING:
    from celery.result import AsyncResult
    from kombu.messaging import Producer

    from ..lease.history import Record

logger = logging.getLogger(__name__)


class PushedHold:
    """A dispatch's hold, taken by the channel as it puts the message
    (``broker.state.HoldWithPush``).

    On the lock store's server the hold and the push are one script; elsewhere (a queue
    on another server) the hold is taken first and the channel then pushes. A duplicate
    raises ``Refused`` from inside the publish: nothing is pushed.
    """

    __slots__ = (
        "_entry",
        "_name",
        "_pushes",
        "_replacing",
        "_store",
        "_token",
        "_ttl",
        "outage",
        "pushed",
        "taken",
        "task_id",
    )

    def __init__(
        self,
        store: LockStore,
        pushes: Pushes,
        lock_name: str,
        ttl: float,
        *,
        token: str,
        task_id: str,
        outage: Callable[[LockStoreUnavailableError], None],
        replacing: tuple[str, str] | None = None,
        entry: Record | None = None,
    ) -> None:
        self._store, self._pushes = store, pushes
        self._entry = entry  # what the take or the swap writes in a kept history
        # (holder, what to record as replaced): the hold passes from the queued call it
        # replaces (on_duplicate="replace"), never from nobody.
        self._replacing = replacing
        self.outage = outage  # the task's singleton_lock_on_redis_error, at dispatch
        self._name, self._ttl, self._token = lock_name, ttl, token
        self.task_id = task_id
        self.taken: Lease | None = None
        self.pushed = False

    def put(self, server: Server | None, push: Push | None) -> bool:
        pushes = self._pushes
        outcome: Lease | Contended | None = None
        pushed = False
        if push is not None and server is not None and server.same_server(pushes.server):
            try:
                outcome = self._take_and_push(push)
                pushed = True
            except PushRefused as refused:
                logger.warning(
                    "the lock store's user may not push to the broker's queue, or select "
                    "its database %s (%s): holds are taken apart from their messages from "
                    "now on. Allow that user the queue's keys and the database (Valkey 9.1's "
                    "per-database ACL) to have them ride the push",
                    push.db,
                    refused,
                )
        if outcome is None:
            outcome = self._take()
        if isinstance(outcome, Contended):
            raise Refused(outcome)
        self.taken, self.pushed = outcome, pushed
        return pushed

    def _take_and_push(self, push: Push) -> Lease | Contended:
        if self._replacing is None:
            return self._pushes.hold_and_push(
                self._name, self._ttl, push, token=self._token, entry=self._entry
            )
        holder, record = self._replacing
        return self._pushes.swap_and_push(
            self._name,
            holder,
            self._ttl,
            push,
            token=self._token,
            record=record,
            entry=self._entry,
        )

    def _take(self) -> Lease | Contended:
        if self._replacing is None:
            return self._store.try_acquire(
                self._name, self._ttl, token=self._token, take=HOLD, entry=self._entry
            )
        holder, record = self._replacing
        return self._store.swap(
            self._name, holder, self._ttl, token=self._token, record=record, entry=self._entry
        )

    def give_back(self) -> None:
        """The publish failed: a hold taken without its message pushed is released (or
        passed back to the queued call it was to replace, whose message is still there)."""
        if self.taken is None or self.pushed:
            return
        if self._replacing is None:
            release_or_warn(self._store.release, self.taken)
        else:
            holder, taken = self._replacing[0], self.taken.token
            release_or_warn(
                lambda _: self._store.swap(self._name, taken, self._ttl, token=holder), self.taken
            )


def answered_early(
    store: LockStore,
    hold: str,
    lock_name: str,
    refused: Callable[[Contended], AsyncResult],
    entry: Record | None = None,
) -> AsyncResult | None:
    """A name refused a moment ago is likely refused again (a storm of duplicates): ask
    who holds ``hold`` with a read that writes nothing (but a refusal in ``entry``'s
    history), and answer a duplicate before Celery builds its message. None: it is free
    (or unknown) now; dispatch as usual."""
    if not refusals.expects(lock_name):
        return None
    try:
        holder = store.holder(hold, entry=entry)
    except LockStoreUnavailableError:
        return None  # the dispatch itself meets the outage and its policy
    if not holder:
        return None
    refusals.note(lock_name, None)
    return refused(Contended(hold, store.keys(hold).lock, holder, None))


def duplicate_answered(
    mode: Mode,
    store: LockStore,
    lock_name: str,
    refused: Callable[[Contended], AsyncResult],
    entry: Record | None = None,
) -> AsyncResult | None:
    """``answered_early`` for a dispatch of ``mode`` before anything else of it is built;
    None for a mode whose answer to a duplicate is a swap (``Ride.send`` asks then)."""
    held = mode.answered_by(lock_name)
    return None if held is None else answered_early(store, held, lock_name, refused, entry)


@dataclass(frozen=True)
class Ride:
    """A dispatch's lock operations riding its message's push, the lock store being a
    server a broker channel may push to (``broker.pushes.pushes_of``)."""

    store: LockStore
    pushes: Pushes
    hold: str  # the lock the dispatch holds
    outage: Callable[[LockStoreUnavailableError], None]
    producers: Callable[[], AbstractContextManager[Producer]]  # the app's producer_or_acquire
    swaps: bool = False  # a refused call's answer is a swap, asked here (``Mode.answered_by``)
    entry: Record | None = None  # what the take, swap or read writes in a kept history

    def send(self, sent: Sent, ttl: float, token: str) -> AsyncResult | None:
        """The hold taken in the push's script; None when the producer's channel cannot
        push there (the caller holds apart)."""
        guess = refusals.holder_guess(self.hold) if self.swaps else None
        if guess is not None:
            # A storm of replacing calls from this process: the last replacement likely
            # still holds it, and the swap that follows checks (and pushes) in one step.
            return sent.refused_by(
                Contended(self.hold, self.store.keys(self.hold).lock, guess, None)
            )
        # Any other mode's duplicate was answered early before the dispatch was built.
        early = (
            answered_early(self.store, self.hold, sent.lock_name, sent.refused_by, self.entry)
            if self.swaps
            else None
        )
        if early is not None:
            return early
        with self.producers() as real:
            if not rides(real.channel, self.pushes.server):
                return None
            pushed = PushedHold(
                self.store,
                self.pushes,
                self.hold,
                ttl,
                token=token,
                task_id=sent.task_id,
                outage=self.outage,
                entry=self.entry,
            )
            return send_pushed(pushed, sent, via=real)

    def replace(self, replacing: Replacing, publish: Publish) -> Lease | Contended | None:
        """A replacing call's message sent with the swap in its push (``RidingReplace``)."""
        with self.producers() as real:
            if not rides(real.channel, self.pushes.server):
                return None
            pushed = PushedHold(
                self.store,
                self.pushes,
                self.hold,
                replacing.ttl,
                token=replacing.token,
                task_id=replacing.task_id,
                outage=self.outage,
                replacing=(replacing.holder, replacing.record),
                entry=self.entry,
            )
            outcome = send_replacing(pushed, publish, replacing, via=real)
        refusals.placed(self.hold, outcome.token if isinstance(outcome, Lease) else None)
        return outcome


def send_replacing(
    pushed: PushedHold, publish: Publish, replacing: Replacing, *, via: object
) -> Lease | Contended:
    """Publish a replacing call's message under the queued call's id with the hold passed
    to it as the channel puts it (``PushedHold`` with ``replacing``): the swap and the
    push in one round trip. ``Contended``: the queued call changed meanwhile, nothing
    was sent."""
    try:
        with publishing(via, hold=pushed):
            publish(pushed.task_id, replacing.options, replacing.headers, via=via)
    except Refused as refused:
        return refused.held
    except BaseException:
        pushed.give_back()
        raise
    if pushed.taken is None:
        # The message left by a way no channel of ours saw (another greenlet's publish
        # took the slot): the hold passes after it, as it did before the ride.
        try:
            pushed.put(None, None)
        except Refused as refused:
            logger.info("%s: replaced before its hold passed, which changed", pushed.task_id)
            return refused.held
    assert pushed.taken is not None  # noqa: S101  (put took it or raised)
    return pushed.taken


def send_pushed(pushed: PushedHold, sent: Sent, *, via: object) -> AsyncResult:
    """Publish with the hold taken as the channel puts the message (``broker.publishing``)."""
    try:
        with publishing(via, hold=pushed):
            result = sent.publish(sent.task_id, sent.options, sent.own_headers, via=via)
    except Refused as refused:
        refusals.note(sent.lock_name, refused.held.retry_after)
        return sent.refused_by(refused.held)
    except LockStoreUnavailableError as error:
        # Nothing was taken or pushed: fail_closed raises, fail_open publishes plainly.
        pushed.outage(error)
        return sent.publish(sent.task_id, sent.options, {NAME_HEADER: sent.lock_name})
    except BaseException:
        pushed.give_back()  # a hold whose message was not pushed
        raise
    if pushed.taken is None:
        # The message left by a way no channel of ours saw (another greenlet's publish
        # took the slot): its hold comes after it, as a dispatch's did before the ride.
        try:
            pushed.put(None, None)
        except Refused:
            logger.info("%s: published before its hold, which another call holds", sent.lock_name)
        except LockStoreUnavailableError as error:
            pushed.outage(error)
    refusals.forget(sent.lock_name)
    sent.accepted()
    return result
