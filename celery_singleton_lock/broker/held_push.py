"""A held call published with its hold, or a replacing call's swap, taken by the script that
pushes its message: one round trip, the one plain Celery makes; a duplicate pushes nothing,
and there is never a hold without its message (elsewhere: ``PushedHold``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..exceptions import LockStoreUnavailableError
from ..lease import HOLD, Contended, Lease, Server
from ..outages import release_or_warn
from .connection import publishing
from .pushes import Push, Pushes, PushRefused
from .state import HeldCall, Refused
from .transport import rides

if TYPE_CHECKING:
    from celery.result import AsyncResult

    from ..modes.stages import Replacing

logger = logging.getLogger(__name__)


class LastReplacements:
    """The hold this process last put in a queued call's place (``on_duplicate="replace"``),
    by lock: the next replacing call guesses it still holds, and its swap checks.

    Only picks the order of a dispatch, never its outcome (Redis decides every time).
    """

    LIMIT = 4096

    def __init__(self) -> None:
        self._placed: dict[str, str] = {}

    def placed(self, hold: str, token: str | None) -> None:
        """This process's replacement now holds ``hold`` as ``token`` (None: forget)."""
        if token is None:
            self._placed.pop(hold, None)
            return
        if len(self._placed) >= self.LIMIT:
            self._placed.clear()
        self._placed[hold] = token

    def holder_guess(self, hold: str) -> str | None:
        return self._placed.get(hold)


replacements = LastReplacements()


class PushedHold:
    """A held call's hold, taken by the channel as it puts the message
    (``state.HoldWithPush``).

    On the lock store's server the hold and the push are one script; elsewhere (a queue
    on another server) the hold is taken first and the channel then pushes. A duplicate
    raises ``Refused`` from inside the publish: nothing is pushed. With ``replacing``
    (``on_duplicate="replace"``), the hold passes from the queued call it replaces, never
    from nobody, and the message is that call's successor.
    """

    __slots__ = ("_call", "_replacing", "pushed", "taken", "task_id", "token", "ttl")

    def __init__(self, call: HeldCall, replacing: Replacing | None = None) -> None:
        self._call = call
        self._replacing = replacing
        if replacing is None:
            self.task_id, self.token, self.ttl = call.task_id or "", call.token, call.ttl
        else:
            self.task_id, self.token, self.ttl = replacing.task_id, replacing.token, replacing.ttl
        self.taken: Lease | None = None
        self.pushed = False

    def put(self, server: Server | None, push: Push | None) -> bool:
        pushes = self._call.pushes
        outcome: Lease | Contended | None = None
        pushed = False
        if (
            push is not None
            and server is not None
            and pushes is not None
            and server.same_server(pushes.server)
        ):
            try:
                outcome = self._take_and_push(pushes, push)
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

    def _take_and_push(self, pushes: Pushes, push: Push) -> Lease | Contended:
        call = self._call
        if self._replacing is None:
            return pushes.hold_and_push(
                call.hold, self.ttl, push, token=self.token, entry=call.record
            )
        return pushes.swap_and_push(
            call.hold,
            self._replacing.holder,
            self.ttl,
            push,
            token=self.token,
            record=self._replacing.record,
            entry=call.record,
        )

    def _take(self) -> Lease | Contended:
        call = self._call
        store = call.context.store
        if self._replacing is None:
            return store.try_acquire(
                call.hold, self.ttl, token=self.token, take=HOLD, entry=call.record
            )
        return store.swap(
            call.hold,
            self._replacing.holder,
            self.ttl,
            token=self.token,
            record=self._replacing.record,
            entry=call.record,
        )

    def give_back(self) -> None:
        """The publish failed: a hold taken without its message pushed is released (or
        passed back to the queued call it was to replace, whose message is still there)."""
        if self.taken is None or self.pushed:
            return
        store, hold = self._call.context.store, self._call.hold
        if self._replacing is None:
            release_or_warn(store.release, self.taken)
        else:
            holder, taken = self._replacing.holder, self.taken.token
            release_or_warn(lambda _: store.swap(hold, taken, self.ttl, token=holder), self.taken)


def send_riding(call: HeldCall, pushes: Pushes, swaps: bool) -> AsyncResult | Contended | None:
    """The call's hold taken in the push's script (the lock store being ``pushes``'
    server, one a broker channel may push to). ``Contended``: refused, nothing sent;
    None when the producer's channel cannot push there (the caller holds apart).
    ``swaps``: a refused call's answer is a swap, asked here (``Mode.answered_by``: no
    read answered it first)."""
    if swaps:
        guess = replacements.holder_guess(call.hold)
        if guess is not None:
            # A storm of replacing calls from this process: the last replacement likely
            # still holds it, and the swap that follows checks (and pushes) in one step.
            return Contended(call.hold, call.context.store.keys(call.hold).lock, guess, None)
        # Any other mode's duplicate was answered early before the dispatch was built.
        early = call.answered_early(call.hold)
        if early is not None:
            return early
    with call.context.app.producer_or_acquire(call.producer) as real:
        if not rides(real.channel, pushes.server):
            return None
        return send_pushed(call, PushedHold(call), via=real)


def replace_riding(
    call: HeldCall, pushes: Pushes, replacing: Replacing
) -> Lease | Contended | None:
    """A replacing call's message sent with the swap in its push (``publish.replacement``):
    the ``Lease`` of the new hold, ``Contended`` (the queued call changed; nothing sent),
    or None when it cannot ride (the swap is then a round trip of its own)."""
    with call.context.app.producer_or_acquire(call.producer) as real:
        if not rides(real.channel, pushes.server):
            return None
        outcome = send_replacing(PushedHold(call, replacing), call, replacing, via=real)
    replacements.placed(call.hold, outcome.token if isinstance(outcome, Lease) else None)
    return outcome


def send_replacing(
    pushed: PushedHold, call: HeldCall, replacing: Replacing, *, via: object
) -> Lease | Contended:
    """Publish a replacing call's message under the queued call's id with the hold passed
    to it as the channel puts it (``PushedHold`` with ``replacing``): the swap and the
    push in one round trip. ``Contended``: the queued call changed meanwhile, nothing
    was sent."""
    try:
        with publishing(via, hold=pushed):
            call.publish(pushed.task_id, replacing.options, replacing.headers, via=via)
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


def send_pushed(call: HeldCall, pushed: PushedHold, *, via: object) -> AsyncResult | Contended:
    """Publish with the hold taken as the channel puts the message (``publishing``);
    ``Contended``: refused, nothing pushed (the caller answers it)."""
    try:
        with publishing(via, hold=pushed):
            result = call.publish_held(via)
    except Refused as refused:
        call.refused(refused.held)
        return refused.held
    except LockStoreUnavailableError as error:
        # Nothing was taken or pushed: fail_closed raises, fail_open publishes plainly.
        call.outage(error)
        return call.publish_unheld()
    except BaseException:
        pushed.give_back()  # a hold whose message was not pushed
        raise
    if pushed.taken is None:
        # The message left by a way no channel of ours saw (another greenlet's publish
        # took the slot): its hold comes after it, as a dispatch's did before the ride.
        try:
            pushed.put(None, None)
        except Refused:
            logger.info("%s: published before its hold, which another call holds", call.lock_name)
        except LockStoreUnavailableError as error:
            call.outage(error)
    call.accepted()
    return result


__all__ = ["LastReplacements", "PushedHold", "replace_riding", "replacements", "send_riding"]
