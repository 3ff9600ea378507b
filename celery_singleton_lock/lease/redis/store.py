"""``RedisLock``: leases on named locks in one Redis (any topology), a round trip per operation."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from redis.commands.core import Script

from ...exceptions import ConfigurationError
from ..history import Record
from ..lease import Lease, LostCallback
from ..limits.slots import Slots
from ..names import DEFAULT_PREFIX, Held
from ..outcomes import LOSS, Contended, ReleaseResult, decode, text
from ..pending import PendingAcquire
from ..renewal import Renewer, get_renewer
from ..takeover import FRESH, TakeOver, WaitMode
from . import recording
from .answers import SentAcquire
from .calls import Response, run_script
from .clients import SyncClient, build, eviction_policy, is_async
from .common import REDIS_ERRORS, Block, Call, ScriptArgs, Sleep, Try
from .extending import Extending
from .helpers import Helpers
from .inventory import BATCH, family, scan
from .pipelining import Pipelining
from .replicas import replicas_option, with_acks
from .replies import Reply
from .waits import pop_within

logger = logging.getLogger(__name__)

Helper = TypeVar("Helper")


class RedisLock(Extending):
    """Leases on named locks in one Redis, one round trip per operation.

    Fencing tokens: each acquire of a name returns a ``fence`` strictly greater than every
    earlier fence of that name (how, and under which assumptions: ``scripts.ACQUIRE``).

    Safety rests on a single Redis primary: a failover to a replica that missed the last
    write can hand a lock out twice; fences catch exactly that. An unreachable server
    raises ``LockStoreUnavailableError``; one that refuses us for how it is set up,
    ``LockStoreConfigurationError``.
    """

    def __init__(
        self,
        client: SyncClient,
        *,
        prefix: str = DEFAULT_PREFIX,
        allow_long_ttl: bool = False,
        backoff_base: float = 0.005,
        backoff_cap: float = 0.5,
        renewer: Renewer | None = None,
        replicas: int = 0,
        replica_timeout: float = 0.5,
    ) -> None:
        if is_async(client):
            raise ConfigurationError("RedisLock needs a sync redis-py client; use AsyncRedisLock")
        self.replicas = replicas_option(replicas, replica_timeout, client)
        super().__init__(
            client,
            prefix=prefix,
            allow_long_ttl=allow_long_ttl,
            backoff_base=backoff_base,
            backoff_cap=backoff_cap,
        )
        self._renewer = renewer
        self._slots: Slots | None = None
        self.pipelining = Pipelining(client, clock=self.clock)
        self._holder_script = client.register_script(recording.HOLDER)
        self._helpers = Helpers(self)

    def helper(self, make: Callable[[RedisLock], Helper]) -> Helper:
        """What ``make`` builds over this store (its rates, backlogs, overrides...),
        made at the first use and kept as long as the store: its scripts registered once."""
        return self._helpers.get(make)

    def _register(self, source: str) -> Script:
        return self.client.register_script(source)

    @classmethod
    def from_url(
        cls, url: str, *, prefix: str = DEFAULT_PREFIX, **client_options: object
    ) -> RedisLock:
        """Connect to ``url``: any form ``clients.build`` takes (standalone, Sentinel, Cluster)."""
        return cls(build(url, client_options), prefix=prefix)

    @property
    def renewer(self) -> Renewer:
        return self._renewer if self._renewer is not None else get_renewer()

    def try_acquire(
        self,
        name: str,
        ttl: object,
        *,
        token: str | None = None,
        take: TakeOver = FRESH,
        entry: Record | None = None,
    ) -> Lease | Contended:
        """One attempt, one round trip: a ``Lease``, or ``Contended`` naming the holder.

        ``token``: the lease's (None: a new random one). ``take``: whom it may take the
        key over from, and whether it is fenced (``TakeOver``); a token taken over passes
        the lock to the new lease in one step, with a new fence. ``entry``: the history
        entry it writes (``history.Record``), in the same step.
        """
        call = self._acquire_call(name, ttl, token, take)
        return self._send_try(call, Try(announce=False), entry=entry).outcome()

    def begin_try_acquire(
        self,
        name: str,
        ttl: object,
        *,
        token: str | None = None,
        take: TakeOver = FRESH,
        read_late: bool = False,
        entry: Record | None = None,
    ) -> PendingAcquire:
        """``try_acquire`` in two halves: send now, ``.outcome()`` reads the answer, so
        the round trip overlaps the caller's work (Celery's dispatch builds its message).
        Validation errors raise here; store errors from either half. ``read_late``: the
        answer may be read long after (or never), so the script's body is sent, not its
        digest: a server that lost its scripts still applies the acquire at once."""
        call = self._acquire_call(name, ttl, token, take)
        return self._send_try(call, Try(announce=False), whole=read_late, entry=entry)

    def _send_try(
        self,
        call: Call,
        step: Try,
        *,
        whole: bool = False,
        entry: Record | None = None,
        within: float | None = None,
    ) -> PendingAcquire:
        sent_at = self.clock.monotonic()
        try:
            script = self._acquire_script
            fast = call.plain and not (step.announce or whole or entry)
            if fast and self.replicas is None:
                reply = self.pipelining.send_hold(
                    call.keys.lock,
                    call.token,
                    call.ttl_ms,
                    lambda: run_script(self.client, script, **self._acquire_argv(call, step)),
                )
            else:
                reply = self.pipelining.send(
                    script,
                    **self._acquire_argv(call, step),
                    whole=whole,
                    acks=self.replicas,
                    entry=entry,
                )
        except REDIS_ERRORS as error:
            self.unavailable(error, call.name)
        return PendingAcquire(SentAcquire(self, call, reply.sent_at or sent_at, reply, within))

    def acquire(
        self,
        name: str,
        ttl: object,
        *,
        blocking: bool = True,
        timeout: object | None = None,
        wait: WaitMode = "push",
        token: str | None = None,
        take: TakeOver = FRESH,
        renew: bool = False,
        on_lost: LostCallback | None = None,
        entry: Record | None = None,
    ) -> Lease:
        """Take the lock, waiting up to ``timeout`` seconds (None: as long as it takes).

        ``wait="push"`` sleeps in BLPOP and is woken by the release (it holds one pooled
        connection while it waits); ``wait="spin"`` retries with exponential backoff
        and full jitter. Either way no wait outlasts the holder's TTL. With
        ``renew=True`` the process's renewal thread keeps the lease alive until
        ``release``. Raises ``LockNotAcquiredError`` naming the holder on failure.
        """
        call = self._acquire_call(name, ttl, token, take)
        plan = self.acquire_plan(blocking, timeout, wait)
        step, since = next(plan), self.moment()
        try:
            while True:
                if isinstance(step, Try):
                    since = self.moment()
                    sent = self._send_try(call, step, entry=entry, within=self.try_within)
                    step = plan.send(sent.outcome())
                    continue
                self.pause(name, step, since)
                step = next(plan)
        except StopIteration as done:
            lease = self.granted(done.value, on_lost)
        if renew:
            self.renew(lease)
        return lease

    def moment(self) -> float:
        """When a try was sent, for ``pause`` (on the store's clock)."""
        return self.clock.monotonic()

    def pause(self, name: str, step: Block | Sleep, since: float) -> None:
        """A blocked acquire's wait between its tries (of ``name`` or its slots): BLPOP
        on its wake-up list, woken by a release (``Block``), or a backoff (``Sleep``).
        ``since``: the ``moment`` of the try it follows."""
        if isinstance(step, Sleep):
            time.sleep(step.seconds)
            return
        try:
            pop_within(self.client, self.keys(name).signal, step.seconds)
        except REDIS_ERRORS as error:
            self.unavailable(error, name)

    def outcome_of(self, call: Call, *, sent_at: float, reply: Response) -> Lease | Contended:
        """What a sent acquire's ``reply`` means, replica acknowledgements included."""
        if self.replicas is None:
            return self.acquired(call, sent_at=sent_at, reply=reply)
        return with_acks(self, call, sent_at, reply)

    def renew(self, lease: Lease) -> None:
        """Keep ``lease`` alive from the process's renewal thread until it is released."""
        self.renewer.add(self, lease)

    def hand_over(self, lease: Lease, ttl: object, *, token: str) -> Lease | Contended:
        """Pass the lock from ``lease`` to ``token`` in one step (e.g. to a retry's message).

        Stops renewing ``lease``; on success it counts as released. ``Contended`` means
        ``lease`` had already lost the lock. Unfenced: a queued message's hold takes it.
        """
        self.renewer.discard(lease)
        with lease.releasing():
            outcome = self.try_acquire(
                lease.name, ttl, token=token, take=TakeOver(replace=lease.token, fenced=False)
            )
        if isinstance(outcome, Contended):
            lease.note_loss(LOSS[ReleaseResult.NOT_OWNER])
        return outcome

    def swap(
        self,
        name: str,
        expected: str,
        ttl: object,
        *,
        token: str,
        record: str | None = None,
        entry: Record | None = None,
    ) -> Lease | Contended:
        """Pass ``name`` from ``expected`` (never from nobody) to ``token``, recording
        ``record`` (or ``expected``) as replaced for ``unless_replaced``. Unfenced."""
        call = self._acquire_call(name, ttl, token, TakeOver(replace=expected, fenced=False))
        sent_at = self.clock.monotonic()
        try:
            reply = self.pipelining.call(
                self._swap_script,
                keys=[call.keys.lock, call.keys.replaced],
                args=[expected, call.token, call.ttl_ms, record or expected],
                entry=entry,
            )
        except REDIS_ERRORS as error:
            self.unavailable(error, name)
        return self.acquired(call, sent_at=sent_at, reply=reply)

    def release(self, lease: Lease, *, entry: Record | None = None) -> ReleaseResult:
        """Delete the lock if ``lease`` still owns it, and wake one waiter. A store error
        propagates and leaves the lease as it was, so the caller can retry with the same
        handle (unlike redis-py #4258, nothing is forgotten first)."""
        with Lease.require(lease, "release").releasing() as again:
            try:
                reply = self._send_release(lease, entry=entry).get()
            except REDIS_ERRORS as error:
                self.unavailable(error, lease.name)
        return self.release_answer(lease, reply, again=again)

    def release_nowait(self, lease: Lease, *, entry: Record | None = None) -> None:
        """``release`` without waiting for the answer: it is read before the next call of
        any thread of this process (a lost lease is logged then); the release itself
        reaches Redis at once. For the end of a task, where nobody acts on the result:
        the pool child is free for its next task a round trip sooner."""
        with Lease.require(lease, "release_nowait").releasing() as again:
            try:
                reply = self._send_release(lease, whole=True, entry=entry)
            except REDIS_ERRORS as error:
                self.unavailable(error, lease.name)
        self.pipelining.defer(reply, lambda answer: self.release_answer(lease, answer, again=again))

    def stop_renewing(self, lease: Lease) -> None:  # before a release: a racing renewal is no loss
        self.renewer.discard(lease)

    def _send_release(
        self, lease: Lease, *, whole: bool = False, entry: Record | None = None
    ) -> Reply:
        argv = self.release_argv(lease.name, lease.token)
        self.stop_renewing(lease)
        return self.pipelining.send(self._release_script, **argv, whole=whole, entry=entry)

    def release_token(self, name: str, token: str, *, entry: Record | None = None) -> ReleaseResult:
        """Release ``name`` if ``token`` holds it: for a holder known only by its token."""
        argv = self.release_argv(name, token)
        return self._call_decoded(name, self._release_script, argv, entry=entry)

    def release_matching(
        self,
        name: str,
        prefix: str,
        suffix: str = "",
        *,
        or_shape: tuple[str, str] | None = None,
    ) -> ReleaseResult:
        """Release ``name`` if its token starts with ``prefix`` and ends with ``suffix``
        (or matches ``or_shape``, a second (prefix, suffix)), in one round trip.

        For releasing on behalf of a dead holder whose token shape is known but not its
        random part; the prefix must be specific enough to name that holder alone.
        """
        argv = self._release_matching_argv(name, prefix, suffix, or_shape)
        return self._call_decoded(name, self._release_matching_script, argv)

    def _call_decoded(
        self, name: str, script: Script, argv: ScriptArgs, *, entry: Record | None = None
    ) -> ReleaseResult:
        try:
            return decode(self.pipelining.call(script, **argv, entry=entry), ReleaseResult)
        except REDIS_ERRORS as error:
            self.unavailable(error, name)

    def eviction_policy(self) -> str | None:
        """The server's ``maxmemory-policy`` (None if it will not say, e.g. CONFIG is denied)."""
        try:
            return eviction_policy(self.client)
        except REDIS_ERRORS as error:
            self.unavailable(error)

    @property
    def slots(self) -> Slots:
        """Counting leases on this store: ``lock.slots.try_acquire(name, limit, ttl)``."""
        if self._slots is None:
            self._slots = Slots(self)
        return self._slots

    def holder(self, name: str, *, entry: Record | None = None) -> str | None:
        """The token holding ``name``, or None (with ``entry`` recording reads: a script
        writing the refusal in its history)."""
        key = self.keys(name).lock
        try:
            if entry is not None and "read" in entry.events:
                value = self.pipelining.call(self._holder_script, [key], [], entry=entry)
            else:
                value = self.pipelining.command("GET", key)
        except REDIS_ERRORS as error:
            self.unavailable(error, name)
        return None if value is None else text(value)

    def holdings(self, batch: int = BATCH, *, of: str | None = None) -> Iterator[Held]:
        """Every lock held under the prefix, a batch at a time; or the holds of the lock
        ``of`` alone (its own, companions and slots: one round trip). See ``inventory``."""
        return scan(self, batch=batch) if of is None else family(self, of)

    @contextmanager
    def hold(
        self, name: str, ttl: object, *, renew: bool = True, **options: Any
    ) -> Iterator[Lease]:
        """``with lock.hold("name", ttl=30) as lease:`` acquire, renew, release on exit."""
        lease = self.acquire(name, ttl, renew=renew, **options)
        try:
            yield lease
        finally:
            self.release(lease)


def one_server(store: object, what: str, keeps: str, used_by: str) -> RedisLock:
    """``store``, the one Redis server ``what`` needs; any other store (a Redlock of
    several masters) refused, saying what to write instead."""
    if isinstance(store, RedisLock):
        return store
    where = getattr(store, "where", repr(store))
    if len(getattr(store, "nodes", ())) > 1:  # a Redlock's masters
        raise ConfigurationError(
            f"{what} need one lock store; {where} is a Redlock of several masters, which "
            f"cannot keep {keeps}: use a standalone, Sentinel or Cluster lock store {used_by}"
        )
    raise ConfigurationError(f"{what} need a RedisLock (memory:// is one), got {store!r}")
