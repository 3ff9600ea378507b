"""The sweep on the worker's timer that sends the calls attached beside a lock once their
holder is gone (and its run's end, which sends them first): to be answered with the
holder's outcome, or promoted to a call of its own when the holder ended without one.
"""

from __future__ import annotations

import logging
import secrets
import time
from functools import partial
from typing import TYPE_CHECKING

from billiard.exceptions import WorkerLostError
from celery import states

from ..config.options import is_singleton
from ..config.stores import LockStores
from ..exceptions import SingletonLockError
from ..lease.attachments import Attachments, Waiting, attachments_of
from ..outages import release_or_warn
from ..tokens import ANSWER_HEADER, NAME_HEADER, header, holder_task_id
from .kept import kept_message, send_kept

if TYPE_CHECKING:
    from celery import Celery, Task

    from ..context import Request
    from ..lease import Lease
    from ..lease.history import Record

logger = logging.getLogger(__name__)

# A run's end with an outcome its attached calls answer with.
ENDED = (states.SUCCESS, states.FAILURE)


def holders_outcome(backend: object, holder: str) -> tuple[str, object] | None:
    """(SUCCESS or FAILURE, its value or exception) as ``holder``'s run stored it, for its
    attached calls to end with; None where it left no outcome: nothing stored yet, a
    revoke, an ``Ignore``, or a pool child killed under it (Celery stores that as a
    FAILURE, ``WorkerLostError``, though the work never ended)."""
    meta = backend.get_task_meta(holder)  # type: ignore[attr-defined]
    status, result = meta.get("status"), meta.get("result")
    if status == states.SUCCESS:
        return status, result
    if status == states.FAILURE and isinstance(result, BaseException):
        return None if isinstance(result, WorkerLostError) else (status, result)
    return None


class AttachSweep:
    """Every ``interval`` s on a worker's timer (``singleton_lock_attach_sweep``): the
    calls attached to holders that no longer hold their key are claimed and sent
    (``send_kept``), to be answered with the holder's stored outcome; where it left none,
    one is promoted (it holds the key and runs as a call of its own) and the others
    attach to it. The holder's own run sends its calls as it ends (``at_end``): the timer
    finds those a crash, a revoke or an ``Ignore`` left.

    A holder whose outcome is not stored yet may still be writing it (a run with a chain
    releases its key before Celery stores its result): no call of it is promoted before
    ``GRACE`` s have passed since a sweep first found it gone (a call attached anew, to a
    promoted call, waits for its new holder's outcome as long). A claim lasts ``CLAIM`` s:
    a worker killed while sending leaves its claims to another sweep, so none is lost
    (one sent twice then is run twice, as a redelivery is).
    """

    GRACE = 3.0
    CLAIM = 60.0
    LIMIT = 100

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.interval = LockStores.for_app(app).config.attach_sweep
        # (name, task id) -> (its holder, when this sweep first saw that holder gone with
        # no outcome)
        self._gone: dict[tuple[str, str], tuple[str, float]] = {}

    @classmethod
    def of(cls, app: Celery) -> AttachSweep | None:
        """A worker's sweep; None where no call attaches (a store in memory, a Redlock,
        a Cluster)."""
        return cls(app) if attachments_of(LockStores.for_app(app).lock) is not None else None

    def __call__(self) -> None:
        attachments = attachments_of(LockStores.for_app(self.app).lock)
        if attachments is None:
            return
        if len(self._gone) > 100 * self.LIMIT:  # calls another worker's sweep sent
            self._gone.clear()
        # A store out of reach raises: the worker's timer pauses the sweep (worker.timers).
        names = attachments.due_names(self.LIMIT)
        outcomes: dict[str, bool] = {}
        for name in names:
            self._sweep(attachments, name, outcomes)

    def at_end(self, attachments: Attachments, name: str) -> None:
        """A holder's run of ``name`` ended, its outcome stored: its attached calls (one
        read of the lock's) are sent now rather than at the next sweep."""
        current, waiting = attachments.listed(name)
        if waiting:
            self._sweep(attachments, name, {}, (current, waiting))

    def _sweep(
        self,
        attachments: Attachments,
        name: str,
        outcomes: dict[str, bool],
        listed: tuple[str, list[Waiting]] | None = None,
    ) -> None:
        current, waiting = attachments.listed(name) if listed is None else listed
        live = holder_task_id(current) if current else None
        now = time.monotonic()
        answered: list[str] = []
        gone: dict[str, Waiting] = {}  # a holder that left no outcome -> a call to promote
        for call in waiting:
            seen = (name, call.task_id)
            if call.holder == live:
                self._gone.pop(seen, None)
                continue
            if call.holder not in outcomes:
                outcomes[call.holder] = self._has_outcome(call.holder)
            if outcomes[call.holder]:
                answered.append(call.task_id)
            elif now - self._gone_since(seen, call.holder, now) >= self.GRACE:
                # One not claimed first (a claim that ran out is the script's to tell).
                first = gone.get(call.holder)
                if first is None or (first.claimed and not call.claimed):
                    gone[call.holder] = call
        if answered or not waiting:  # (none: the name leaves the index)
            self._claim_and_send(attachments, name, answered)
        for holder, call in gone.items():
            self._promote(attachments, name, holder, call, waiting)

    def _gone_since(self, seen: tuple[str, str], holder: str, now: float) -> float:
        """When this sweep first saw ``holder`` gone for call ``seen``: the clock is the
        holder's, not the call's (a promoted call's own run may free its key before its
        outcome is stored, as its gone holder did)."""
        since = self._gone.get(seen)
        if since is None or since[0] != holder:
            since = self._gone[seen] = (holder, now)
        return since[1]

    def _claim_and_send(self, attachments: Attachments, name: str, task_ids: list[str]) -> None:
        """Claim ``task_ids`` and send each with its holder's id to answer from."""
        claim = secrets.token_hex(8)
        claimed = attachments.claim(
            name, task_ids, claim=claim, for_s=self.CLAIM, look_in=self.interval
        )
        sent = [call.task_id for call in claimed if self._send(name, call, call.holder)]
        if sent:
            attachments.finished(name, claim, sent)

    def _promote(
        self,
        attachments: Attachments,
        name: str,
        holder: str,
        call: Waiting,
        waiting: list[Waiting],
    ) -> None:
        """``holder`` ended without an outcome: ``call`` becomes a call of its own, holding
        the key, and the holder's other calls wait for it (or for whoever holds the key
        now). Held by a value no call attaches to: each is sent to run as its own."""
        claim = secrets.token_hex(8)
        promoted = attachments.promote(name, holder, call.task_id, claim=claim, for_s=self.CLAIM)
        if promoted is None:
            return
        if promoted.record is not None:
            kept = Waiting(call.task_id, holder, promoted.record, claimed=True)
            if self._send(name, kept, None):
                attachments.finished(name, claim, [call.task_id])
        elif not promoted.holder:
            theirs = [other.task_id for other in waiting if other.holder == holder]
            self._claim_and_send(attachments, name, theirs)

    def _has_outcome(self, holder: str) -> bool:
        """Whether ``holder``'s run stored an outcome its attached calls answer with."""
        try:
            return holders_outcome(self.app.backend, holder) is not None
        except Exception as error:  # any backend's error: looked at again next sweep
            logger.warning("celery-singleton-lock: result of %s not read (%s)", holder, error)
            return False

    def _send(self, name: str, call: Waiting, holder: str | None) -> bool:
        """Send ``call``'s kept message: to answer from ``holder``, or (None) promoted."""
        try:
            send_kept(self.app, call.record, holder=holder)
        except Exception:
            # Its claim runs out and a later sweep sends it.
            logger.exception("celery-singleton-lock: attached call %s not sent", call.task_id)
            return False
        self._gone.pop((name, call.task_id), None)
        logger.info(
            "attached call sent at its holder's end: id=%s lock=%s holder=%s then=%s",
            call.task_id,
            name,
            call.holder,
            "answer" if holder is not None else "run",
        )
        return True


# Where a run's release asked whether calls are attached beside its lock, on Celery's
# request for its ``task_postrun``: a list the answer is appended to once read.
ASKED = "singleton_lock_attached"


def release_asking(task: Task, request: Request, lease: Lease, entry: Record | None) -> bool:
    """A run's release on a round trip of its own, where its end will look for attached
    calls (``send_at_end``): asking in the same write whether there are any. False: not
    asked (a mode that does not attach, no result stored, a store that keeps none): the
    caller releases as ever."""
    attachments = attachments_of(task.singleton_context.store)
    if attachments is None or not _looks_at_end(task, request):
        return False
    answer: list[bool] = []
    setattr(request, ASKED, answer)
    release_or_warn(partial(attachments.release_asking, entry=entry, then=answer.append), lease)
    return True


def _looks_at_end(task: Task, request: Request) -> bool:
    """Whether ``request``'s run sends its attached calls as it ends (if it stores its
    outcome): a held call of a mode that attaches, with its result stored."""
    if request.is_eager or task.ignore_result or getattr(request, "ignore_result", False):
        return False
    if not header(request, NAME_HEADER) or header(request, ANSWER_HEADER):
        return False  # no hold of its own, or an answered call's run: it held nothing
    return is_singleton(task) and bool(task.singleton_options().mode.attaches)


def send_at_end(task: Task, request: Request, state: str) -> None:
    """A run's end, its outcome stored (``task_postrun``): the calls attached to it are
    sent by its own worker now, to be answered (the sweep on the timer stays for a
    worker killed first). Only a run of a mode that attaches, with its result stored,
    and where its release (riding its result's write, or ``release_asking``) did not
    say none are attached; one read of them else. A store error is the sweep's to meet
    later."""
    told = getattr(task.backend, "attached_told", None)  # ``results.RedisBackend``'s
    if (told is not None and told(request.id) is False) or state not in ENDED:
        return
    if not _looks_at_end(task, request):
        return
    attachments = attachments_of(task.singleton_context.store)
    if attachments is None:
        return
    asked = getattr(request, ASKED, None)  # its release's answer (``release_asking``)
    if asked is not None and not asked:
        attachments.read_answers()  # here long since: no wait
    if asked is not None and asked != [True]:
        return  # none attached, or the release failed (a store out of reach): the sweep's
    name = header(request, NAME_HEADER) or ""
    try:
        AttachSweep(task.app).at_end(attachments, name)
    except SingletonLockError as error:
        logger.warning("celery-singleton-lock: attached calls not sent at the end (%s)", error)


__all__ = [
    "ASKED", "AttachSweep", "holders_outcome", "kept_message", "release_asking", "send_at_end",
    "send_kept",
]  # fmt: skip
