"""A pending call's hold beside its key (``lock="until_executing"``), from the execution's side.

At dispatch such a call holds the companion lock ``companion(key, "pending")``, not the
key: the key is for the running execution, so one call may run while the next waits.
"""

from __future__ import annotations

import logging

from kombu.exceptions import KombuError

from ..context import TaskContext
from ..exceptions import LockStoreUnavailableError, SingletonLockError
from ..lease import Contended, Lease, TakeOver, companion
from ..lease.offers import offers_of
from ..modes import arguments
from ..tokens import HOLD_HEADER, TOKEN_HEADER, requeue_token

logger = logging.getLogger(__name__)


class PendingHold:
    """The hold of the message being executed: queued at dispatch, or reserved since.

    When the execution gets the key's running lease it lets the hold go (the next call may
    queue, and will see data this run did not). While it cannot get the key it stays the
    pending call: it keeps the hold while it waits, and passes it to its requeued message.
    Where later calls replace the pending call's arguments (replace, cancel, debounce), one
    made while this execution holds the hold leaves them for it (``offered``): the
    execution runs, or is requeued, with the newest.
    """

    def __init__(  # noqa: PLR0917  (the message's hold, as the execution knows it)
        self,
        context: TaskContext,
        task_id: str,
        lock_name: str,
        role: str,
        queued: str | None,
        reserved: tuple[str, str] | None,
        token: str,
        *,
        offered: bool = False,
    ) -> None:
        self._context = context
        self._offered = offered  # a later call may leave its arguments (replace, cancel)
        self._task_id = task_id
        self.role = role
        self.name = companion(lock_name, role)
        self._queued = queued
        self._reserved = reserved  # the worker's reservation's shape; None when eager
        self._token = token  # the execution's running token
        self._lease: Lease | None = None
        self._done = False

    def _take(
        self, ttl: float, token: str, unless_replaced: str | None = None
    ) -> Lease | Contended:
        """The hold under ``token``, taken over from whichever form it has now."""
        return self._context.store.try_acquire(
            self.name,
            ttl,
            token=token,
            take=TakeOver(
                replace=self._queued,
                shape=self._reserved,
                fenced=False,
                unless_replaced=unless_replaced,
            ),
        )

    def claim(self) -> Contended | None:
        """Take the hold under the execution's token (nobody can replace it then).

        None when taken; else who holds it instead (a later message of the same task id
        that replaced this one, or another call once this hold had expired), or that
        this message was replaced (even if its replacement has run since).
        """
        outcome = self._take(self._context.ttl, self._token, unless_replaced=self._queued)
        if isinstance(outcome, Lease):
            self._lease = outcome
            return None
        return outcome

    def keep(self) -> None:
        """Make the hold this execution's own and renew it while it waits for the key."""
        try:
            if self._lease is None:
                outcome = self._take(self._context.ttl, self._token)
                self._lease = outcome if isinstance(outcome, Lease) else None
        except LockStoreUnavailableError as error:
            logger.warning("%s: could not keep its pending hold (%s)", self.name, error)
            return
        if self._lease is not None:
            self._context.store.renew(self._lease)

    def pass_on(self, ttl: float, attempt: int) -> dict[str, str]:
        """Hand the hold to the message requeued as ``attempt``; the headers it carries."""
        store = self._context.store
        token = requeue_token(self._task_id, self._queued, attempt)
        try:
            if self._lease is not None:
                outcome = store.hand_over(self._lease, ttl, token=token)
                passed = isinstance(outcome, Lease)
            else:
                passed = isinstance(self._take(ttl, token), Lease)
        except LockStoreUnavailableError as error:
            logger.warning("%s: its pending hold stays behind (%s)", self.name, error)
            return {}
        self._done = passed
        return {TOKEN_HEADER: token, HOLD_HEADER: self.role} if passed else {}

    def let_go(self) -> None:
        """Release the hold: the run has the key, or the call ends without running."""
        if self._done:
            return
        self._done = True
        store = self._context.store
        try:
            if self._lease is not None:
                if not self._lease.released:
                    store.release(self._lease)
            elif self._reserved is not None:
                also = (self._queued, "") if self._queued else None
                store.release_matching(self.name, *self._reserved, or_shape=also)
            elif self._queued:
                store.release_token(self.name, self._queued)
        except LockStoreUnavailableError as error:
            logger.warning("%s: pending hold not released (%s); its ttl frees it", self.name, error)

    def offered(self) -> tuple[list[object], dict[str, object]] | None:
        """The arguments a later call left for this execution while it held the hold,
        waiting for the key (``lease.offers``): read once, after the hold was let go or
        passed on, so none comes after the read. None: it runs with its own."""
        offers = offers_of(self._context.store) if self._offered else None
        if offers is None:
            return None
        try:
            value = offers.take(self.name, self._token)
            if value is None:
                return None
            return arguments.load(value, self._context.app.conf.accept_content)
        except (SingletonLockError, KombuError, ValueError) as error:
            # The run goes on with its own (it holds the key now: it must not fail here).
            logger.warning("%s: a later call's arguments not read (%s)", self.name, error)
            return None
