"""``Redlock``: leases held on a majority of independent Redis masters, fenced across holders.

antirez's algorithm (redis.io, "Distributed Locks with Redis"); how a lease is taken, kept
and fenced on the masters: ``Redlock`` (its extends judged by ``keeping``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, NoReturn, TypeVar

from ...exceptions import ConfigurationError, LockStoreUnavailableError, SingletonLockError
from ..clock import SYSTEM_CLOCK
from ..lease import Lease, LostCallback
from ..limits.slots import QuorumSlots
from ..names import DEFAULT_PREFIX, Held, LockKeys, new_token
from ..outcomes import LOSS, Contended, ExtendResult, ReleaseResult
from ..pending import PendingAcquire
from ..redis import scripts
from ..redis.inventory import BATCH
from ..redis.store import RedisLock
from ..redis.urls import redlock_masters
from ..renewal import Renewer, get_renewer
from ..takeover import FRESH, TakeOver
from .keeping import QuorumExtend
from .quorum import Answers, Attempt, Quorum

if TYPE_CHECKING:
    from ..history import Record  # kept by none of these stores: taken and not written

T = TypeVar("T")

# A try waits for the masters' answers at most this share of its ttl (antirez: a small
# timeout next to the ttl, so a dead master cannot eat the validity), and never longer
# than ANSWER_WAIT; calls without a ttl (release, holder) wait up to ANSWER_WAIT.
TRY_SHARE = 0.25
ANSWER_WAIT = 5.0
MIN_MASTERS = 3


class Redlock:
    """Leases on a majority of ``nodes`` (one ``RedisLock`` per independent master).

    One token set on every master at once; held when a majority granted it, for
    ``ttl * 0.99 - 2 ms`` from before the first send (``lease.valid_until``), else given
    back on every master. Renewal keeps it while a majority confirms; release goes to
    every master. The fence is the greatest a majority gave, raised on every master and
    confirmed by a majority still holding our token: why fences then increase across
    holders, and what that assumes, docs/topologies.md "Redlock".

    The same interface as ``RedisLock`` (``LockStore``); waits poll with jittered
    backoff (the masters share no wake-up), and nothing rides a broker's round trips.
    Rate limits are refused: a rate is one counter, which N masters cannot keep as one.
    """

    clock = SYSTEM_CLOCK  # the masters' ttls run in real time

    def __init__(self, nodes: Sequence[RedisLock], *, renewer: Renewer | None = None) -> None:
        if len(nodes) < MIN_MASTERS:
            raise ConfigurationError(
                f"Redlock needs at least {MIN_MASTERS} independent masters (5 is usual), got "
                f"{len(nodes)}: list them as redlock://host1:6379,host2:6379,host3:6379"
            )
        if len({node.prefix for node in nodes}) != 1:
            raise ConfigurationError("every Redlock master must use the same key prefix")
        self.nodes = list(nodes)
        self.prefix = self.nodes[0].prefix
        self.quorum = Quorum(len(self.nodes))
        self.where = f"redlock({', '.join(node.where for node in self.nodes)})"
        self.quorum_extend = QuorumExtend(self.nodes, self.quorum, self.where)
        self._renewer = renewer
        self._raise = [node.client.register_script(scripts.RAISE_FENCE) for node in self.nodes]
        self._slots: QuorumSlots | None = None

    @classmethod
    def from_url(
        cls, url: str, *, prefix: str = DEFAULT_PREFIX, **client_options: object
    ) -> Redlock:
        """Connect to every master a ``redlock://host1,host2,host3`` URL names."""
        return cls(
            [
                RedisLock.from_url(one, prefix=prefix, **client_options)
                for one in redlock_masters(url)
            ]
        )

    def __repr__(self) -> str:
        return f"Redlock({self.where}, prefix={self.prefix!r})"

    @property
    def renewer(self) -> Renewer:
        return self._renewer if self._renewer is not None else get_renewer()

    @property
    def slots(self) -> QuorumSlots:
        if self._slots is None:
            self._slots = QuorumSlots(self)
        return self._slots

    def keys(self, name: str) -> LockKeys:
        return self.nodes[0].keys(name)

    def ttl_ms(self, ttl: object) -> int:
        return self.nodes[0].ttl_ms(ttl)

    def unavailable(self, error: Exception, name: str | None = None) -> NoReturn:
        key = None if name is None else self.keys(name).lock
        if isinstance(error, SingletonLockError):
            raise error
        raise LockStoreUnavailableError(
            f"the lock store at {self.where} is unreachable ({type(error).__name__}: {error})",
            name=name,
            key=key,
            url=self.where,
        ) from error

    # -- taking ---------------------------------------------------------------------

    def try_acquire(
        self,
        name: str,
        ttl: object,
        *,
        token: str | None = None,
        take: TakeOver = FRESH,
        entry: Record | None = None,
    ) -> Lease | Contended:
        """One try on every master at once: a ``Lease`` held on a majority, or ``Contended``."""
        key, ttl_ms, token = self.keys(name).lock, self.ttl_ms(ttl), new_token(token)
        sent_at = time.monotonic()

        def try_on(node: RedisLock) -> Lease | Contended:
            return node.try_acquire(name, ttl_ms / 1000, token=token, take=take)

        attempt = self._attempt([partial(try_on, node) for node in self.nodes], name, token)
        answers = self.quorum.ask(
            attempt.calls, timeout=self._try_wait(ttl_ms), settled=self._decided
        )
        leases = [one for one in answers.values() if isinstance(one, Lease)]
        if len(leases) >= self.quorum.needed:
            fence = max(lease.fence for lease in leases) if take.fenced else 0
            if not take.fenced or self._raise_fence(name, token, fence, ttl_ms):
                lease = Lease.granted(
                    name, key, token, fence=fence, ttl=ttl_ms / 1000, sent_at=sent_at
                )
                if lease.remaining() > 0:
                    return lease
        attempt.give_back(self.quorum, ANSWER_WAIT)
        self.quorum.judge(answers, self.where, name, self.keys(name).lock)
        contended = [one for one in answers.values() if isinstance(one, Contended)]
        return Contended.combined(name, key, contended, ttl_ms)

    def _decided(self, answers: Answers[Lease | Contended]) -> bool:
        # Errors decide nothing: a store error is an outage only if too few answer.
        return self.quorum.settles(answers, lambda one: isinstance(one, Lease))

    def _try_wait(self, ttl_ms: int) -> float:
        return min(ANSWER_WAIT, ttl_ms / 1000 * TRY_SHARE)

    def _raise_fence(self, name: str, token: str, fence: int, ttl_ms: int) -> bool:
        keys = self.keys(name)
        answers = self.quorum.ask(
            [
                partial(
                    node.pipelining.call, script, [keys.lock, keys.fence], [token, fence, ttl_ms]
                )
                for node, script in zip(self.nodes, self._raise, strict=True)
            ],
            timeout=self._try_wait(ttl_ms),
            settled=lambda so_far: self.quorum.settles(so_far, lambda held: int(held) == 1),
        )
        return answers.count(lambda held: int(held) == 1) >= self.quorum.needed

    def _attempt(
        self, calls: Sequence[Callable[[], Lease | Contended]], name: str, token: str
    ) -> Attempt[Lease | Contended]:
        """A try that, failing, releases ``token`` on every master (a failed try leaves
        nothing behind for the ttl, however late a master answers)."""
        return Attempt(calls, [partial(node.release_token, name, token) for node in self.nodes])

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
        """``try_acquire``, already answered (the masters' round trips overlap each other,
        not the caller's work)."""
        return PendingAcquire.settled(self.try_acquire(name, ttl, token=token, take=take))

    def acquire(
        self,
        name: str,
        ttl: object,
        *,
        blocking: bool = True,
        timeout: object | None = None,
        wait: object = "spin",
        token: str | None = None,
        take: TakeOver = FRESH,
        renew: bool = False,
        on_lost: LostCallback | None = None,
        entry: Record | None = None,
    ) -> Lease:
        """Take the lock, retrying with jittered backoff up to ``timeout`` (either
        ``wait``: no master can wake a waiter for all of them)."""
        token = new_token(token)
        plan = self.nodes[0].acquire_plan(blocking, timeout, "spin")
        step = next(plan)
        try:
            while True:
                step = plan.send(self.try_acquire(name, ttl, token=token, take=take))
                time.sleep(getattr(step, "seconds", 0.0))
                step = next(plan)
        except StopIteration as done:
            lease = RedisLock.granted(done.value, on_lost)
        if renew:
            self.renewer.add(self, lease)
        return lease

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
        """Pass ``name`` from ``expected`` to ``token`` on a majority (see ``RedisLock.swap``)."""
        key, ttl_ms = self.keys(name).lock, self.ttl_ms(ttl)
        sent_at = time.monotonic()
        attempt = self._attempt(
            [
                partial(node.swap, name, expected, ttl_ms / 1000, token=token, record=record)
                for node in self.nodes
            ],
            name,
            token,
        )
        answers = self.quorum.ask(
            attempt.calls, timeout=self._try_wait(ttl_ms), settled=self._decided
        )
        if answers.count(lambda one: isinstance(one, Lease)) >= self.quorum.needed:
            lease = Lease.granted(name, key, token, fence=0, ttl=ttl_ms / 1000, sent_at=sent_at)
            if lease.remaining() > 0:
                return lease
        attempt.give_back(self.quorum, ANSWER_WAIT)
        self.quorum.judge(answers, self.where, name, self.keys(name).lock)
        contended = [one for one in answers.values() if isinstance(one, Contended)]
        return Contended.combined(name, key, contended, ttl_ms)

    def hand_over(self, lease: Lease, ttl: object, *, token: str) -> Lease | Contended:
        """Pass the lock from ``lease`` to ``token`` (see ``RedisLock.hand_over``)."""
        self.renewer.discard(lease)
        with lease.releasing():
            outcome = self.try_acquire(
                lease.name, ttl, token=token, take=TakeOver(replace=lease.token, fenced=False)
            )
        if isinstance(outcome, Contended):
            lease.note_loss(LOSS[ReleaseResult.NOT_OWNER])
        return outcome

    # -- keeping --------------------------------------------------------------------

    def renew(self, lease: Lease) -> None:
        self.renewer.add(self, lease)

    def stop_renewing(self, lease: Lease) -> None:
        self.renewer.discard(lease)

    def lane(self, lease: Lease) -> Hashable:
        return None  # every renewal goes to every master: one lane

    def extend(self, lease: Lease, ttl: object | None = None) -> ExtendResult:
        """Reset the lease's ttl on every master still holding it; kept while a majority does."""
        result = self.extend_many([lease], ttl)[0]
        if isinstance(result, Exception):
            raise result
        return result

    def extend_many(
        self, leases: Sequence[Lease], ttl: object | None = None
    ) -> list[ExtendResult | Exception]:
        """``extend`` each lease, one pipelined round trip per master, all masters at once."""
        ttls = [self.ttl_ms(lease.ttl if ttl is None else ttl) for lease in leases]
        return self.quorum_extend.extend_many(leases, ttls, timeout=self._try_wait(min(ttls)))

    # -- letting go -----------------------------------------------------------------

    def release(self, lease: Lease, *, entry: Record | None = None) -> ReleaseResult:
        """Release ``lease`` on every master (see ``RedisLock.release``)."""
        with Lease.require(lease, "release").releasing() as again:
            self.stop_renewing(lease)
            result = self._release(
                lease.name, lambda node, name: node.release_token(name, lease.token)
            )
        return RedisLock.release_answer(lease, int(result), again=again)

    def release_nowait(self, lease: Lease, *, entry: Record | None = None) -> None:
        self.release(lease)  # the masters answer in parallel: one round trip's wait

    def release_token(self, name: str, token: str, *, entry: Record | None = None) -> ReleaseResult:
        return self._release(name, lambda node, name: node.release_token(name, token))

    def release_matching(
        self,
        name: str,
        prefix: str,
        suffix: str = "",
        *,
        or_shape: tuple[str, str] | None = None,
    ) -> ReleaseResult:
        def matching(node: RedisLock, name: str) -> ReleaseResult:
            return node.release_matching(name, prefix, suffix, or_shape=or_shape)

        return self._release(name, matching)

    def _release(self, name: str, how: Callable[[RedisLock, str], ReleaseResult]) -> ReleaseResult:
        answers = self.quorum.ask(
            [partial(how, node, name) for node in self.nodes],
            timeout=ANSWER_WAIT,
            settled=self.quorum.heard,
        )
        self.quorum.judge(answers, self.where, name, self.keys(name).lock)
        released = answers.count(lambda one: one is ReleaseResult.RELEASED)
        # A master that did not answer may have released too: counted for the holder.
        if released + answers.unanswered() >= self.quorum.needed:
            return ReleaseResult.RELEASED
        return Counter(answers.values()).most_common(1)[0][0]

    # -- reading --------------------------------------------------------------------

    def holder(self, name: str, *, entry: Record | None = None) -> str | None:
        """The token holding ``name`` on a majority of masters (None when none does)."""
        answers = self.quorum.ask(
            [partial(node.holder, name) for node in self.nodes],
            timeout=ANSWER_WAIT,
            settled=self.quorum.agreed,
        )
        self.quorum.judge(answers, self.where, name, self.keys(name).lock)
        held = Counter(one for one in answers.values() if one is not None).most_common(1)
        return held[0][0] if held and held[0][1] >= self.quorum.needed else None

    def holdings(self, batch: int = BATCH, *, of: str | None = None) -> Iterator[Held]:
        """Every lock held (or ``of``'s) on a majority of masters, by the same token."""
        seen: dict[tuple[str, str], list[Held]] = {}
        answered = 0
        for node in self.nodes:
            try:
                for held in node.holdings(batch, of=of):
                    seen.setdefault((held.key, held.token), []).append(held)
            except LockStoreUnavailableError:
                continue
            answered += 1
        if answered < self.quorum.needed:
            raise LockStoreUnavailableError(
                f"the lock store at {self.where} has too few masters answering to list its "
                f"locks: {answered} of {self.quorum.count}",
                url=self.where,
            )
        for found in seen.values():
            if len(found) >= self.quorum.needed:
                yield min(found, key=lambda held: held.ttl or 0.0)
