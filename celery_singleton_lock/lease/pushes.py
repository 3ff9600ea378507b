"""A hold and the push of the message it holds for, in one script and one round trip.

For a broker whose queues live on the lock store's own Redis server (kombu's Redis
transport): the message is pushed only if the hold is taken, in the same step, so
there is no moment with a hold and no message, or a message and no hold.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

from redis.commands.core import Script

from . import scripts
from .base import REDIS_ERRORS, Call
from .calls import Arg
from .clients import Server, SyncClient
from .errors import is_refusal
from .lease import Contended, Lease
from .names import LockKeys, new_token
from .transport import Transport


class _Store(Protocol):
    """What of a ``RedisLock`` this uses (it builds this: not imported, no cycle)."""

    client: SyncClient
    transport: Transport

    def keys(self, name: str) -> LockKeys: ...
    def ttl_ms(self, ttl: object) -> int: ...
    def unavailable(self, error: Exception, name: str | None = None) -> NoReturn: ...
    @staticmethod
    def acquired(call: Call, *, sent_at: float, reply: Any) -> Lease | Contended: ...


@dataclass(frozen=True)
class Push:
    """One message to push: ``LPUSH key payload`` in database ``db`` (None: the lock
    store's), then ``PEXPIRE`` of each of ``expire`` (a queue that expires unused)."""

    key: str
    payload: str | bytes
    db: int | None = None
    expire: tuple[tuple[str, ...], int] | None = None


class PushRefused(Exception):
    """The server refused the push (nothing was written): push the message apart."""


class Pushes:
    """Holds taken with their message's push on one ``RedisLock`` (``lock.pushes``)."""

    def __init__(self, store: _Store, server: Server) -> None:
        self._store = store
        self.server = server  # where the store is: a push must go to the same server
        self.usable = True  # False once the server refused a push (ACL)
        self._script: Script = store.client.register_script(scripts.HOLD_AND_PUSH)

    def hold_and_push(self, name: str, ttl: object, push: Push, *, token: str) -> Lease | Contended:
        """Hold ``name`` for ``ttl`` (unfenced, like a dispatch's hold) and push ``push``;
        or ``Contended`` naming the holder, with nothing pushed. One round trip."""
        store = self._store
        call = Call(
            name=name,
            keys=store.keys(name),
            token=new_token(token),
            ttl_ms=store.ttl_ms(ttl),
            replace="",
            shape=("", ""),
            fenced=False,
        )
        keys: list[Arg] = [call.keys.lock, push.key]
        expire_ms = ""
        if push.expire is not None:
            keys.extend(push.expire[0])
            expire_ms = str(push.expire[1])
        args: list[Arg] = [
            call.token,
            call.ttl_ms,
            push.payload,
            self._db(push),
            expire_ms,
            self.server.db,
        ]
        sent_at = time.monotonic()
        try:
            reply = store.transport.call(self._script, keys, args)
        except REDIS_ERRORS as error:
            if is_refusal(error, "NOPERM"):
                # This user may hold locks but not push to the broker's queue: nothing
                # was written; from now on the hold goes alone and kombu pushes.
                self.usable = False
                raise PushRefused(str(error)) from None
            store.unavailable(error, name)
        return store.acquired(call, sent_at=sent_at, reply=reply)

    def _db(self, push: Push) -> int | str:
        """The list's database for the script: '' when it is the store's own."""
        return "" if push.db is None or push.db == self.server.db else push.db
