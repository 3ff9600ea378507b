"""Counting leases: up to ``limit`` holders of one name at once, each in a slot of its own.

A slot (``names.slot``) is an ordinary lock: renewed, extended, released, and released
by shape for a dead holder with the scripts every lock uses. Only taking one differs
(``Slots``); on a Redlock slot N is a Redlock lease of its own (``QuorumSlots``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ...exceptions import ConfigurationError
from ..lease import Lease
from ..names import check_limit, new_token, slot
from ..outcomes import Contended, text
from ..redis import scripts
from ..redis.calls import Arg
from ..redis.common import REDIS_ERRORS, ScriptArgs, Step, Try

if TYPE_CHECKING:
    from ..history import Record


class Slots:
    """The counting leases of one ``RedisLock`` (``lock.slots``).

    ``scripts.ACQUIRE_SLOT`` takes the lowest free slot in one step with a fence from the
    name's own fence key, so fences increase across slots, and a release of any slot wakes
    the oldest waiter (the slots share the name's signal and waiters keys; BLPOP serves its
    waiters first come, first served).
    """

    def __init__(self, store: Any) -> None:
        # A RedisLock (not imported: it builds this, and the layer keeps no cycle).
        self._store = store
        self._script = store.client.register_script(scripts.ACQUIRE_SLOT)

    def _argv(
        self, name: str, limit: int, token: str, ttl_ms: int, *, announce: bool, cap: int | None
    ) -> ScriptArgs:
        store, base = self._store, self._store.keys(name)
        held = [store.keys(slot(name, number)).lock for number in range(1, limit + 1)]
        args: list[Arg] = [token, ttl_ms, "1" if announce else "0"]
        if cap is not None and cap < limit:
            args.append(cap)
        return {"keys": [base.fence, base.waiters, *held], "args": args}

    def _try(
        self, name: str, token: str, argv: ScriptArgs, ttl_ms: int, entry: Record | None
    ) -> Lease | Contended:
        store = self._store
        sent_at = store.clock.monotonic()
        acked: int | None = None
        try:
            if store.replicas is not None:
                reply, acked = store.pipelining.call(
                    self._script, **argv, acks=store.replicas, entry=entry, within=store.try_within
                )
            else:
                reply = store.pipelining.call(
                    self._script, **argv, entry=entry, within=store.try_within
                )
        except REDIS_ERRORS as error:
            store.unavailable(error, name)
        if int(reply[0]) != 1:
            pttl = int(reply[2])
            return Contended(
                name=name,
                key=store.keys(name).lock,
                holder=text(reply[1]),
                retry_after=None if pttl < 0 else pttl / 1000,
            )
        held = slot(name, int(reply[2]))
        lease = Lease.granted(
            held,
            store.keys(held).lock,
            token,
            fence=int(reply[1]),
            ttl=ttl_ms / 1000,
            sent_at=sent_at,
            clock=store.clock,
        )
        if store.replicas is not None and acked is not None and acked < store.replicas[0]:
            store.release(lease)  # as for any acquire: too few replicas, given back
            return Contended(name, store.keys(name).lock, "", store.replicas[1] / 1000)
        return lease

    def try_acquire(
        self,
        name: str,
        limit: int,
        ttl: object,
        *,
        token: str | None = None,
        entry: Record | None = None,
        cap: int | None = None,
    ) -> Lease | Contended:
        """The lowest free slot of ``name`` as a ``Lease`` (its ``name`` is the slot's),
        or ``Contended`` naming the holder of the slot that frees soonest. One round trip.
        ``cap``: fewer than ``limit`` may be held at once (a lowered limit), the slots
        above it looked at all the same."""
        limit = check_limit(limit)
        ttl_ms = self._store.ttl_ms(ttl)
        token = new_token(token)
        argv = self._argv(name, limit, token, ttl_ms, announce=False, cap=cap)
        return self._try(name, token, argv, ttl_ms, entry)

    def acquire(
        self,
        name: str,
        limit: int,
        ttl: object,
        *,
        timeout: object | None = None,
        token: str | None = None,
        entry: Record | None = None,
        cap: int | None = None,
    ) -> Lease:
        """Wait up to ``timeout`` for a slot, woken by the release of any (push, FIFO).

        Raises ``LockNotAcquiredError`` naming a holder when the time is up.
        """
        store, limit = self._store, check_limit(limit)
        ttl_ms = store.ttl_ms(ttl)
        token = new_token(token)
        plan = store.acquire_plan(True, timeout, "push")
        step: Step = next(plan)
        since = store.moment()
        try:
            while True:
                if isinstance(step, Try):
                    since = store.moment()
                    argv = self._argv(name, limit, token, ttl_ms, announce=step.announce, cap=cap)
                    step = plan.send(self._try(name, token, argv, ttl_ms, entry))
                else:
                    store.pause(name, step, since)
                    step = next(plan)
        except StopIteration as done:
            lease: Lease = store.granted(done.value, None)
            return lease


class QuorumSlots:
    """Up to ``limit`` holders of a name on a Redlock: slot N is a Redlock lease of its own,
    taken in order, so no two holders share a slot on a majority (per-master counting would
    allow more)."""

    def __init__(self, store: Any) -> None:  # a Redlock (which builds this)
        self.store = store

    def try_acquire(
        self,
        name: str,
        limit: int,
        ttl: object,
        *,
        token: str | None = None,
        entry: Record | None = None,
        cap: int | None = None,
    ) -> Lease | Contended:
        if cap is not None:
            raise ConfigurationError("a lowered limit needs one lock store, not a Redlock")
        limit = check_limit(limit)
        token, busy = new_token(token), []
        for number in range(1, limit + 1):
            outcome = self.store.try_acquire(slot(name, number), ttl, token=token)
            if isinstance(outcome, Lease):
                return outcome
            busy.append(outcome)
        soonest = min(busy, key=lambda one: one.retry_after or float("inf"))
        return Contended(name, self.store.keys(name).lock, soonest.holder, soonest.retry_after)

    def acquire(
        self,
        name: str,
        limit: int,
        ttl: object,
        *,
        timeout: object | None = None,
        token: str | None = None,
        entry: Record | None = None,
        cap: int | None = None,
    ) -> Lease:
        token = new_token(token)
        plan = self.store.nodes[0].acquire_plan(True, timeout, "spin")
        next(plan)
        try:
            while True:
                step = plan.send(self.try_acquire(name, limit, ttl, token=token, cap=cap))
                time.sleep(getattr(step, "seconds", 0.0))
                next(plan)
        except StopIteration as done:
            if isinstance(done.value, Contended):
                raise done.value.error() from None
            lease: Lease = done.value
            return lease
