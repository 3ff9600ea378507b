"""A canvas member whose mode attaches: it holds a free key, or joins the call that holds it
(its message kept beside the lock, answered at the holder's end), in the one step that
decides; or it is sent without a hold, as before attach. Its result is its own id's.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from celery.backends.base import DisabledBackend

from .. import signals as singleton_signals
from ..broker.connection import publishing
from ..broker.kept import kept_message
from ..broker.pushes import PushRefused
from ..broker.state import Refused
from ..broker.transport import rides
from ..exceptions import LockStoreUnavailableError
from ..lease import Contended, Lease
from ..lease.attachments import Attached, Attachments, Member, attachments_of
from ..outages import release_or_warn
from ..tokens import HOLD_HEADER, TOKEN_HEADER, holder_task_id, read_token
from .dispatch import long_wait

if TYPE_CHECKING:
    from celery.result import AsyncResult
    from kombu.messaging import Producer

    from ..broker.pushes import Push, Pushes
    from ..lease import Server
    from .call import Dispatch

logger = logging.getLogger(__name__)


def attachments_for(call: Dispatch) -> Attachments | None:
    """Where ``call`` may attach (None: it is sent as before attach): a canvas member of a
    mode that attaches, sent through a producer, whose task stores the results a holder
    answers with, on a lock store of one server."""
    task, options = call.task, call.options
    if not (call.canvas and call.facts.mode.attaches and call.through_producer()):
        return None
    if (
        task.ignore_result
        or options.get("ignore_result")
        or isinstance(task.backend, DisabledBackend)
    ):
        return None
    return attachments_of(call.facts.store)


def send_attaching(call: Dispatch, attachments: Attachments) -> AsyncResult:
    """Publish a canvas member with its hold, or keep it for the call that holds its key
    (nothing sent), or send it without a hold; its own result either way, which its
    chain, group or chord already names."""
    call.plan_hold(long_wait(call.facts, call.options))
    with call.facts.app.producer_or_acquire(call.producer) as real:
        pushes = call.pushes
        ride = pushes if pushes is not None and rides(real.channel, pushes.server) else None
        via = AttachingProducer(real, AttachingHold(call, attachments, ride))
        try:
            sent = call.publish_held(via)
        except Refused as attached:
            _attached(call, attached.held.holder)
            return call.task.AsyncResult(call.task_id)
    if via.held:
        call.accepted()
    return sent


def _attached(call: Dispatch, holder: str) -> None:
    # Its ``attached`` history entry was written by the script that attached it.
    logger.info(
        "attached at dispatch: task=%s id=%s lock=%s holder=%s state=%s",
        call.task.name,
        call.task_id,
        call.lock_name,
        holder_task_id(holder),
        read_token(holder).state or "unknown",
    )
    singleton_signals.send(
        singleton_signals.call_attached,
        call.task,
        call.lock_name,
        task_id=call.task_id,
        holder_id=holder_task_id(holder),
    )


class AttachingHold:
    """A canvas member's hold or attach, decided as its message leaves: in the script that
    pushes it where its channel pushes to the lock store's server (``put``), else in one
    of its own just before the publish. ``Refused`` (raised through the publish): attached,
    nothing sent."""

    __slots__ = (
        "_attachments",
        "_call",
        "_history",
        "_pushes",
        "pushed",
        "record",
        "taken",
        "task_id",
        "unheld",
    )

    def __init__(self, call: Dispatch, attachments: Attachments, pushes: Pushes | None) -> None:
        self._call = call
        self._attachments = attachments
        self._pushes = pushes
        self.task_id = call.task_id or ""
        facts = call.facts  # what its task records: the attach script writes it
        self._history = facts.record(call.lock_name, call.task_id) if facts.keeps_history else None
        self.record: bytes | None = None
        self.taken: Lease | None = None
        self.unheld = False  # sent without a hold: its holder is one no call attaches to
        self.pushed = False  # pushed by the script that decided

    @property
    def rides(self) -> bool:
        return self._pushes is not None

    def put(self, server: Server | None, push: Push | None) -> bool:
        """The channel's (``state.HoldWithPush``): True when pushed here."""
        pushes, call, record = self._pushes, self._call, self.record
        if record is None:
            return False
        if (
            push is not None
            and server is not None
            and pushes is not None
            and server.same_server(pushes.server)
        ):
            try:
                outcome = pushes.hold_push_or_attach(
                    call.hold, call.ttl, push, token=call.token, member=self._member(record)
                )
            except PushRefused:
                outcome = None  # this user may not push: the hold goes alone
            except LockStoreUnavailableError as error:
                call.outage(error)  # fail_closed raises; fail_open: kombu pushes, unheld
                self.unheld = True
                return False
            if outcome is not None:
                self._decided(outcome)
                self.pushed = True
                return True
        self.decide()
        return False

    def decide(self) -> None:
        """The hold or attach on the lock store alone (its own round trip)."""
        call = self._call
        assert self.record is not None  # noqa: S101  (the producer kept it first)
        try:
            outcome = self._attachments.hold_or_attach(
                call.hold, call.ttl, token=call.token, member=self._member(self.record)
            )
        except LockStoreUnavailableError as error:
            call.outage(error)  # fail_closed raises; fail_open sends it without a hold
            self.unheld = True
            return
        self._decided(outcome)

    def _member(self, record: bytes) -> Member:
        return Member(self.task_id, record, self._history)

    def _decided(self, outcome: Lease | Attached | Contended) -> None:
        if isinstance(outcome, Attached):
            raise Refused(Contended(outcome.name, outcome.key, outcome.holder, None))
        if isinstance(outcome, Lease):
            self.taken = outcome
        else:
            self.unheld = True

    def give_back(self) -> None:
        """The message was not sent: a hold taken for it is released."""
        if self.taken is not None and not self.pushed:
            release_or_warn(self._call.facts.store.release, self.taken)
            self.taken = None


class AttachingProducer:
    """Celery's producer, keeping the message as it leaves and deciding its hold or attach
    (``AttachingHold``) before anything is sent."""

    __slots__ = ("_hold", "_producer")

    def __init__(self, producer: Producer, hold: AttachingHold) -> None:
        self._producer = producer
        self._hold = hold

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    @property
    def held(self) -> bool:
        """Whether the message left with its hold taken."""
        return self._hold.taken is not None

    def publish(self, body: object, **kwargs: Any) -> object:
        hold = self._hold
        hold.record = kept_message(body, kwargs)
        if hold.record is None:
            return self._publish_unheld(body, kwargs)
        if hold.rides:
            try:
                with publishing(self._producer, hold=hold):
                    return self._producer.publish(body, **kwargs)  # type: ignore[no-untyped-call]
            except Refused:
                raise
            except BaseException:
                hold.give_back()
                raise
        hold.decide()  # Refused: attached
        if hold.unheld:
            return self._publish_unheld(body, kwargs)
        try:
            return self._producer.publish(body, **kwargs)  # type: ignore[no-untyped-call]
        except BaseException:
            hold.give_back()
            raise

    def _publish_unheld(self, body: object, kwargs: dict[str, Any]) -> object:
        headers = dict(kwargs.get("headers") or {})
        for name in (TOKEN_HEADER, HOLD_HEADER):
            headers.pop(name, None)
        kwargs["headers"] = headers
        return self._producer.publish(body, **kwargs)  # type: ignore[no-untyped-call]


__all__ = ["AttachingHold", "AttachingProducer", "attachments_for", "send_attaching"]
