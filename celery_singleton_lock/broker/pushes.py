"""Lock operations riding a broker's round trips on the lock store's own server.

For a broker whose queues live on the lock store's Redis server (kombu's Redis transport):
a hold and its message's push in one script (``Pushes.hold_and_push``); a received message's
take and a finished run's release in other clients' pipelines (``RidingTake``, ``RidingRelease``).
"""

from __future__ import annotations

import contextlib
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import NoReturn, Protocol

from redis.commands.core import Script
from redis.exceptions import NoScriptError

from ..lease.attachments import DUE, Attached, Member
from ..lease.errors import is_refusal
from ..lease.history import Kind, Record
from ..lease.lease import Lease
from ..lease.names import LockKeys, new_token
from ..lease.outcomes import Contended, ReleaseResult, text
from ..lease.redis import recording, scripts
from ..lease.redis.calls import Arg, Pipeline, Response, body
from ..lease.redis.clients import SyncClient
from ..lease.redis.common import REDIS_ERRORS, Call, ScriptArgs
from ..lease.redis.pipelining import Pipelining
from ..lease.redis.servers import Server, server_of
from ..lease.redis.store import RedisLock
from ..lease.takeover import TakeOver
from . import ride_scripts
from .transit import Note, keys_of


class _Store(Protocol):
    """What of a ``RedisLock`` this uses."""

    client: SyncClient
    pipelining: Pipelining
    prefix: str

    def keys(self, name: str) -> LockKeys: ...
    def acquire_request(
        self, name: str, ttl: object, *, token: str, take: TakeOver
    ) -> tuple[Call, ScriptArgs]: ...
    def outcome_of(self, call: Call, *, sent_at: float, reply: Response) -> Lease | Contended: ...
    def ttl_ms(self, ttl: object) -> int: ...
    def unavailable(self, error: Exception, name: str | None = None) -> NoReturn: ...
    def release_nowait(self, lease: Lease, *, entry: Record | None = None) -> None: ...
    def release_argv(self, name: str, token: str) -> ScriptArgs: ...
    def stop_renewing(self, lease: Lease) -> None: ...
    @staticmethod
    def release_answer(lease: Lease, reply: Response, *, again: bool = False) -> ReleaseResult: ...
    @staticmethod
    def acquired(call: Call, *, sent_at: float, reply: Response) -> Lease | Contended: ...


@dataclass(frozen=True)
class Push:
    """One message to push: ``LPUSH key payload`` in database ``db`` (None: the lock
    store's), then ``PEXPIRE`` of each of ``expire`` (a queue that expires unused).
    ``note``: how it is noted in transit until it is received (``transit``)."""

    key: str
    payload: str | bytes
    db: int | None = None
    expire: tuple[tuple[str, ...], int] | None = None
    note: Note | None = None


class RidingTake:
    """One try for a lock, sent in another client's pipeline to the lock store's server
    (the broker's, recording a received message as unacked).

    ``add`` puts it on the pipeline (EVALSHA of the acquire script wrapped to switch to
    the lock's database); ``read`` takes the pipeline's reply for it. ``outcome`` is then
    the ``Lease`` or ``Contended``, or None when it could not ride (the script was not
    loaded yet, or the server refused it): the caller tries on its own round trip.
    """

    __slots__ = ("_argv", "_call", "_owner", "_record", "_sent_at", "outcome")

    def __init__(
        self, owner: Pushes, call: Call, argv: ScriptArgs, entry: Record | None = None
    ) -> None:
        self._owner = owner
        self._call = call
        self._argv = argv
        self._record = entry  # the history it writes, if any
        self._sent_at = 0.0
        self.outcome: Lease | Contended | None = None

    @property
    def token(self) -> str:
        return self._call.token

    def add(self, pipe: Pipeline, db: int) -> None:
        """Put the try on ``pipe``, a pipeline of a client of database ``db``."""
        owner = self._owner
        keys, args = self._argv["keys"], list(self._argv["args"])
        args.extend([""] * (8 - len(args)))  # ARGV[8]: the script's optional one, given
        args.extend(owner.databases(db))
        self._sent_at = time.monotonic()
        spec = None if self._record is None else self._record.spec("take")
        if self._record is not None and spec is not None:
            keys, args = [*keys, self._record.key], [*args, spec]
            pipe.eval(recording.RIDING_TAKE, len(keys), *keys, *args)
        elif getattr(pipe, "global_keyprefix", None):
            # kombu's key-prefixing pipeline rewrites EVALSHA's first key (the lock's),
            # not EVAL's: the body, whose keys are sent as they are.
            pipe.eval(owner.riding_body, len(keys), *keys, *args)
        else:
            pipe.evalsha(owner.riding_sha, len(keys), *keys, *args)

    def refused(self, error: Exception) -> bool:
        """Whether ``error`` (raised by the pipeline) is the server refusing this take as
        it was queued; riding then stops for good."""
        if is_refusal(error, "NOPERM") or is_refusal(error, "EXECABORT"):
            self._owner.takes_ride = False
            return True
        return False

    def read(self, reply: object) -> None:
        if isinstance(reply, Exception):
            self._owner.not_ridden(reply)
            return
        self.outcome = self._owner.outcome_of(self._call, sent_at=self._sent_at, reply=reply)


class RidingRelease:
    """A finished run's release, sent in another client's pipeline to the lock store's
    server (the result backend's, storing the run's result).

    ``add`` puts it on the pipeline: renewal stops and the lease counts as released
    while the release is in flight (``Lease.releasing``); ``read`` takes the pipeline's
    reply for it. A release that could not ride (``unsent``: the pipeline never reached
    the server; an error reply) is sent on its own round trip, so it is never lost.
    """

    __slots__ = ("_again", "_argv", "_lease", "_owner", "_record", "_releasing")

    def __init__(self, owner: Pushes, lease: Lease, entry: Record | None = None) -> None:
        self._owner = owner
        self._lease = lease
        self._record = entry  # the history it writes, if any
        self._argv = owner.store.release_argv(lease.name, lease.token)
        self._releasing = ExitStack()
        self._again = False

    @property
    def lease(self) -> Lease:
        return self._lease

    def add(self, pipe: Pipeline, db: int) -> None:
        """Put the release on ``pipe``, a pipeline of a client of database ``db``."""
        owner, lease = self._owner, self._lease
        keys, args = self._argv["keys"], list(self._argv["args"])
        args.extend(owner.databases(db))
        owner.store.stop_renewing(lease)  # a renewal racing the release is no loss
        self._again = self._releasing.enter_context(lease.releasing())
        # The body, not the digest: nothing to load first, nothing lost to NOSCRIPT.
        spec = None if self._record is None else self._record.spec("release")
        if self._record is not None and spec is not None:
            keys, args = [*keys, self._record.key], [*args, spec]
            pipe.eval(recording.RIDING_RELEASE, len(keys), *keys, *args)
            return
        pipe.eval(scripts.RIDING_RELEASE, len(keys), *keys, *args)

    def read(self, reply: object) -> None:
        """The pipeline's reply for this release."""
        self._releasing.close()
        if isinstance(reply, Exception):
            if is_refusal(reply, "NOPERM"):
                self._owner.releases_ride = False
            self.alone()
            return
        self._owner.store.release_answer(self._lease, reply, again=self._again)

    def unsent(self, error: BaseException) -> bool:
        """The pipeline failed before an answer: the lease is as before ``add``, to ride
        again (False: its transport failed) or go alone (True: the server refused the
        transaction as it was queued, an ACL user without the lock's keys; riding
        releases stops for good, and whatever else the pipeline held did not run)."""
        self._releasing.__exit__(type(error), error, error.__traceback__)
        self._releasing = ExitStack()
        if isinstance(error, Exception) and (
            is_refusal(error, "NOPERM") or is_refusal(error, "EXECABORT")
        ):
            self._owner.releases_ride = False
            return True
        return False

    def alone(self) -> None:
        """Release on its own round trip (it did not ride the result write)."""
        self._owner.store.release_nowait(self._lease, entry=self._record)


class PushRefused(Exception):
    """The server refused the push (nothing was written): push the message apart."""


class Pushes:
    """Holds taken with their message's push on one ``RedisLock`` (``lock.pushes``)."""

    def __init__(self, store: _Store, server: Server) -> None:
        self._store = store
        self.server = server  # where the store is: a push must go to the same server
        self.usable = True  # False once the server refused a push (ACL)
        self._script: Script = store.client.register_script(ride_scripts.HOLD_AND_PUSH)
        self._swap: Script = store.client.register_script(ride_scripts.SWAP_AND_PUSH)
        self._attach: Script = store.client.register_script(ride_scripts.HOLD_PUSH_OR_ATTACH)
        self._riding: Script = store.client.register_script(scripts.RIDING_ACQUIRE)
        self.riding_sha, self.riding_body = self._riding.sha, body(self._riding)
        self.takes_ride = True  # False once the server refused a riding take
        self.releases_ride = True  # False once the server refused a riding release

    @property
    def store(self) -> _Store:
        return self._store

    def databases(self, db: int) -> list[Arg]:
        """A riding script's last two arguments for a pipeline of database ``db``: the
        lock's database ('' when the same) and the pipeline's, selected again after."""
        own = self.server.db
        return ["" if own == db else own, db]

    def riding_release(self, lease: Lease, *, entry: Record | None = None) -> RidingRelease | None:
        """``lease``'s release, to ride a pipeline of another client of this server (writing
        ``entry`` in its history); None once the server refused one (the caller releases
        on its own round trip)."""
        if not self.releases_ride or lease.released or not lease.token:
            return None
        return RidingRelease(self, lease, entry)

    def riding_take(
        self, name: str, ttl: object, *, token: str, take: TakeOver, entry: Record | None = None
    ) -> RidingTake | None:
        """A try for ``name`` to ride a pipeline of another client of this server; None
        once the server refused one (the caller tries on its own round trip)."""
        if not self.takes_ride:
            return None
        call, argv = self._store.acquire_request(name, ttl, token=token, take=take)
        return RidingTake(self, call, argv, entry)

    def outcome_of(self, call: Call, *, sent_at: float, reply: Response) -> Lease | Contended:
        return self._store.outcome_of(call, sent_at=sent_at, reply=reply)

    def not_ridden(self, error: Exception) -> None:
        """A riding take's error reply: load the script (the server lost or never had
        it), or stop riding (refused: an ACL user without the lock's keys). Any other
        error is the take's own round trip's to meet and report."""
        if isinstance(error, NoScriptError):
            # On failure the next take's own round trip will say what is wrong.
            with contextlib.suppress(*REDIS_ERRORS):
                self._store.client.script_load(body(self._riding))
        elif is_refusal(error, "NOPERM"):
            self.takes_ride = False

    def hold_and_push(
        self, name: str, ttl: object, push: Push, *, token: str, entry: Record | None = None
    ) -> Lease | Contended:
        """Hold ``name`` for ``ttl`` (unfenced, like a dispatch's hold) and push ``push``;
        or ``Contended`` naming the holder, with nothing pushed. One round trip.

        The message is pushed only if the hold is taken, so there is no moment with a hold
        and no message, or a message and no hold.
        """
        call = self._call(name, ttl, token, replace="")
        keys: list[Arg] = [call.keys.lock, push.key]
        args: list[Arg] = [call.token, call.ttl_ms, push.payload]
        return self._run(self._script, call, keys, args, push, entry=entry, kind="take")

    def swap_and_push(
        self,
        name: str,
        expected: str,
        ttl: object,
        push: Push,
        *,
        token: str,
        record: str,
        entry: Record | None = None,
    ) -> Lease | Contended:
        """Pass ``name`` from ``expected`` to ``token`` (``RedisLock.swap``, recording
        ``record`` as replaced) and push ``push``, the replacing message; or ``Contended``
        naming the holder, with nothing pushed. One round trip."""
        call = self._call(name, ttl, token, replace=expected)
        keys: list[Arg] = [call.keys.lock, call.keys.replaced, push.key]
        args: list[Arg] = [expected, call.token, call.ttl_ms, record, push.payload]
        return self._run(self._swap, call, keys, args, push, entry=entry, kind="swap")

    def hold_push_or_attach(
        self, name: str, ttl: object, push: Push, *, token: str, member: Member
    ) -> Lease | Attached | Contended:
        """A canvas member's hold and push (``Lease``); or its message kept for the call
        that holds ``name`` (``Attached``: nothing pushed); or, held by a value no call
        attaches to, its push without a hold (``Contended``: pushed). One round trip."""
        call = self._call(name, ttl, token, replace="")
        keys: list[Arg] = [call.keys.lock, call.keys.attached, self._store.prefix + ":" + DUE]
        keys.extend([call.keys.history, push.key])
        args: list[Arg] = [call.token, call.ttl_ms, push.payload]
        tail: list[Arg] = [*member.args(name)]
        sent_at = time.monotonic()
        reply = self._send(self._attach, call, keys, args, push, entry=None, kind="take", tail=tail)
        if int(reply[0]) == 2:
            return Attached(name, call.keys.lock, text(reply[1]))
        return self._store.acquired(call, sent_at=sent_at, reply=reply)

    def _call(self, name: str, ttl: object, token: str, *, replace: str) -> Call:
        """An unfenced hold of ``name`` for ``token`` (a queued message's)."""
        store = self._store
        return Call(
            name=name,
            keys=store.keys(name),
            token=new_token(token),
            ttl_ms=store.ttl_ms(ttl),
            replace=replace,
            shape=("", ""),
            fenced=False,
        )

    def _run(
        self,
        script: Script,
        call: Call,
        keys: list[Arg],
        args: list[Arg],
        push: Push,
        *,
        entry: Record | None,
        kind: Kind,
    ) -> Lease | Contended:
        """Run a push script: the push's expiry and databases appended to its keys and
        arguments. A push the server refuses (ACL) writes nothing: ``PushRefused``."""
        sent_at = time.monotonic()
        reply = self._send(script, call, keys, args, push, entry=entry, kind=kind)
        return self._store.acquired(call, sent_at=sent_at, reply=reply)

    def _send(
        self,
        script: Script,
        call: Call,
        keys: list[Arg],
        args: list[Arg],
        push: Push,
        *,
        entry: Record | None,
        kind: Kind,
        tail: list[Arg] | None = None,
    ) -> Response:
        """A push script's reply (``_run``); ``tail``: its own arguments after the push's."""
        store = self._store
        keys.extend(keys_of(store.prefix))  # the notes, in the list's database
        expire_ms = ""
        if push.expire is not None:
            keys.extend(push.expire[0])
            expire_ms = str(push.expire[1])
        spec = "" if push.note is None else push.note.spec()
        args.extend([self._db(push), expire_ms, self.server.db, spec, *(tail or ())])
        try:
            reply = store.pipelining.call(script, keys, args, entry=entry, kind=kind)
        except REDIS_ERRORS as error:
            if is_refusal(error, "NOPERM"):
                # This user may hold locks but not push to the broker's queue: nothing
                # was written; from now on the hold goes alone and kombu pushes.
                self.usable = False
                raise PushRefused(str(error)) from None
            store.unavailable(error, call.name)
        return reply

    def _db(self, push: Push) -> int | str:
        """The list's database for the script: '' when it is the store's own."""
        return "" if push.db is None or push.db == self.server.db else push.db


def _made_for(store: RedisLock) -> Pushes | None:
    """``store``'s pushes, made once and kept on the store (``RedisLock.helper``), so
    they go with it: its scripts registered on its client once."""
    server = server_of(store.client)
    return Pushes(store, server) if server else None


def pushes_of(store: object) -> Pushes | None:
    """The pushes of ``store``: one Redis server a broker may share. None for a store in
    memory, a Redlock (no broker shares N masters), a Cluster, one that waits for
    replicas, or one whose server refused a push (``PushRefused``)."""
    if not isinstance(store, RedisLock) or not store.on_a_server or store.replicas is not None:
        return None
    found = store.helper(_made_for)  # one look on every dispatch, receipt and release
    return found if found is not None and found.usable else None
