"""Calls attached to a lock's holder: a message kept beside the lock under the holder's
task id, decided in the step that would have taken the hold, claimed once the holder is gone.

Records are opaque bytes here (a whole message, as the Celery layer keeps it): nothing of
Celery. One Redis server: the due index is one key beside every lock's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from .history import Record
from .lease import Lease
from .names import new_token
from .outcomes import Contended, text
from .redis import scripts
from .redis.calls import Response
from .redis.common import REDIS_ERRORS, Call
from .redis.servers import server_of
from .redis.store import RedisLock

# The due index's key under the prefix: the names with attached calls, scored by when a
# sweep next looks at each (ms since the epoch, the server's clock).
DUE = "attach:due"


@dataclass(frozen=True)
class Attached:
    """A call attached to ``holder`` (its token): kept, not sent."""

    name: str
    key: str
    holder: str


@dataclass(frozen=True)
class Member:
    """A canvas member to hold its key or attach: its task id, its message as kept, and
    what its task records in the lock's history (None: none; its ``attached`` entry, and
    those of the steps that send or promote it)."""

    task_id: str
    record: bytes
    history: Record | None = None

    def args(self, name: str) -> list[str | bytes]:
        """An attach script's last arguments for a member of lock ``name``."""
        history = "" if self.history is None else self.history.compact()
        return [self.task_id, self.record, name, history]


@dataclass(frozen=True)
class Waiting:
    """One attached call: its task id, its holder's task id, its kept message, and whether
    a sweep claimed it (answering or sending it now)."""

    task_id: str
    holder: str
    record: bytes
    claimed: bool = False


@dataclass(frozen=True)
class Promotion:
    """What a promotion did: ``record``, the promoted call's message (send it with its
    hold); else ``holder``, the token the gone holder's calls now wait for ('': a value no
    call attaches to; send them without a hold)."""

    record: bytes | None = None
    holder: str = ""


class Attachments:
    """On a ``RedisLock`` of one server (``attachments_of``).

    ``hold_or_attach`` holds a free key, or keeps a call's message for the task that holds
    it (one script: a holder that ended meanwhile left the key free, and the call holds);
    ``claim`` takes those whose holder no longer holds the key, once each; ``finished``
    forgets them once answered or sent. A claim not finished (its sweeper died) runs out
    and is claimed again: none is lost. ``release_asking``: a holder's release, saying
    whether any call is attached.
    """

    def __init__(self, store: RedisLock) -> None:
        self._store = store
        client = store.client
        self._hold = client.register_script(scripts.HOLD_OR_ATTACH)
        self._claim = client.register_script(scripts.CLAIM_ATTACHED)
        self._finish = client.register_script(scripts.FINISH_ATTACHED)
        self._promote = client.register_script(scripts.PROMOTE_ATTACHED)
        self._release = client.register_script(scripts.RELEASE)
        self.due = f"{store.prefix}:{DUE}"

    def release_asking(
        self, lease: Lease, *, entry: Record | None = None, then: Callable[[bool], object]
    ) -> None:
        """``RedisLock.release_nowait`` of ``lease`` (a holder's, as its run ends), asking
        in the same write whether calls are attached beside its lock: ``then(answer)``
        once the answer is read (before this process's next call, or ``read_owed``)."""
        store = self._store
        attached = store.keys(lease.name).attached
        with Lease.require(lease, "release_asking").releasing() as again:
            argv = store.release_argv(lease.name, lease.token)
            store.stop_renewing(lease)
            try:
                reply = store.pipelining.send(
                    self._release, **argv, whole=True, entry=entry, question=("EXISTS", attached)
                )
            except REDIS_ERRORS as error:
                store.unavailable(error, lease.name)

        def answered(answer: Response) -> None:
            released, exists = answer
            store.release_answer(lease, released, again=again)
            then(bool(exists))

        store.pipelining.defer(reply, answered)

    def read_answers(self) -> None:
        """Read the answers owed to this process now (a ``release_asking``'s among them)."""
        self._store.pipelining.read_owed()

    def hold_or_attach(
        self, name: str, ttl: float, *, token: str, member: Member
    ) -> Lease | Attached | Contended:
        """Hold ``name`` as ``token`` (a ``Lease``, unfenced, like a dispatch's hold); or
        keep ``member``'s message for its holder (``Attached``); or ``Contended``: held by
        a value no call attaches to (a foreign one, an eager run), nothing written."""
        store = self._store
        keys = store.keys(name)
        call = Call(
            name=name,
            keys=keys,
            token=new_token(token),
            ttl_ms=store.ttl_ms(ttl),
            replace="",
            shape=("", ""),
            fenced=False,
        )
        sent_at = time.monotonic()
        try:
            reply = self._hold(
                keys=[keys.lock, keys.attached, self.due, keys.history],
                args=[call.token, call.ttl_ms, *member.args(name)],
            )
        except REDIS_ERRORS as error:
            store.unavailable(error, name)
        if int(reply[0]) == 2:
            return Attached(name, keys.lock, text(reply[1]))
        return store.acquired(call, sent_at=sent_at, reply=reply)

    def due_names(self, limit: int) -> list[str]:
        """Up to ``limit`` names with attached calls, those looked at longest ago first."""
        try:
            found = self._store.client.zrange(self.due, 0, limit - 1)
        except REDIS_ERRORS as error:
            self._store.unavailable(error)
        return [text(one) for one in found]

    def listed(self, name: str) -> tuple[str, list[Waiting]]:
        """The token holding ``name`` ('' when free) and the calls attached beside it."""
        store = self._store
        keys = store.keys(name)
        try:
            with store.client.pipeline(transaction=False) as pipe:
                pipe.get(keys.lock)
                pipe.hgetall(keys.attached)
                current, kept = pipe.execute()
        except REDIS_ERRORS as error:
            store.unavailable(error, name)
        waiting = [_waiting(text(field), raw) for field, raw in (kept or {}).items()]
        return ("" if current is None else text(current)), waiting

    def counts(self, names: list[str]) -> list[int]:
        """How many calls are attached beside each of ``names``: one round trip."""
        store = self._store
        try:
            with store.client.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.hlen(store.keys(name).attached)
                found = pipe.execute()
        except REDIS_ERRORS as error:
            store.unavailable(error)
        return [int(count) for count in found]

    def claim(
        self, name: str, task_ids: list[str], *, claim: str, for_s: float, look_in: float
    ) -> list[Waiting]:
        """Claim ``task_ids`` attached beside ``name`` whose holder no longer holds it (and
        no live claim has), for ``for_s`` seconds; the sweep looks at ``name`` again in
        ``look_in`` seconds while any is left."""
        store = self._store
        keys = store.keys(name)
        args: list[str | int] = [name, claim, int(for_s * 1000), int(look_in * 1000), *task_ids]
        try:
            reply = self._claim(keys=[keys.lock, keys.attached, self.due, keys.history], args=args)
        except REDIS_ERRORS as error:
            store.unavailable(error, name)
        return [
            Waiting(text(reply[i]), text(reply[i + 1]), _bytes(reply[i + 2]), claimed=True)
            for i in range(0, len(reply), 3)
        ]

    def promote(
        self, name: str, holder: str, task_id: str, *, claim: str, for_s: float
    ) -> Promotion | None:
        """``task_id``, attached to ``holder`` which ended without an outcome, becomes a
        call of its own: it holds ``name`` with its message's hold, claimed for ``for_s``
        seconds to be sent, and ``holder``'s other calls wait for it (``Promotion``).
        None: nothing to do (the holder is back, or the call was claimed or sent)."""
        store = self._store
        keys = store.keys(name)
        args: list[str | int] = [name, holder, task_id, claim, int(for_s * 1000)]
        try:
            reply = self._promote(
                keys=[keys.lock, keys.attached, self.due, keys.history], args=args
            )
        except REDIS_ERRORS as error:
            store.unavailable(error, name)
        kind = int(reply[0])
        if kind == 1:
            return Promotion(record=_bytes(reply[1]))
        if kind == 2:
            return Promotion(holder=text(reply[1]))
        return Promotion(holder="") if kind == 3 else None

    def finished(self, name: str, claim: str, task_ids: list[str]) -> int:
        """Forget ``task_ids``, answered or sent under ``claim``."""
        store = self._store
        keys = store.keys(name)
        try:
            done = self._finish(keys=[keys.attached, self.due], args=[name, claim, *task_ids])
        except REDIS_ERRORS as error:
            store.unavailable(error, name)
        return int(done)


def _bytes(value: object) -> bytes:
    if isinstance(value, str):
        return value.encode()
    return value if isinstance(value, bytes) else str(value).encode()


def _waiting(task_id: str, raw: object) -> Waiting:
    kept = json.loads(_bytes(raw))
    return Waiting(task_id, str(kept["h"]), str(kept["r"]).encode(), claimed=bool(kept["c"]))


def attachments_of(store: object) -> Attachments | None:
    """The attachments of ``store``: one Redis server other processes reach. None for a
    store in memory, a Redlock, a Cluster (the due index is one key beside every lock's):
    canvas members there are sent as before attach."""
    if not isinstance(store, RedisLock) or not store.on_a_server:
        return None
    if server_of(store.client) is None:
        return None
    return store.helper(Attachments)


__all__ = [
    "DUE",
    "Attached",
    "Attachments",
    "Member",
    "Promotion",
    "Waiting",
    "attachments_of",
]  # fmt: skip
