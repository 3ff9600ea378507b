"""Turns of a task's ``total_limit`` across its keys: a waiting room handing freed slots out
round robin (weighted), so one key's flood cannot starve the others (``Turns``).

Kept messages are opaque bytes here (nothing of Celery); one Redis server only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..lease import Lease
from ..names import slot
from ..outcomes import Contended, text
from ..redis import scripts
from ..redis.common import REDIS_ERRORS
from ..redis.servers import server_of
from ..redis.store import RedisLock
from .rates import Charge

# The set of rooms with calls in them, under the prefix: what a sweep looks at.
ROOMS = "turns:rooms"
# How long a turn handed to a call stays reserved for it: its message is on its way.
# One that runs out (the message lost with a worker) is put back at the head of its
# key's line and handed out again; the call's start claims it whichever comes first.
RESERVE = 60.0
# How long a call's stamp is kept once it left the room (it started, or gave its turn
# back): a message of it with another stamp is a copy, dropped: the one it was kept from
# delivered again (its worker died between keeping it and its ack), or one sent on an
# earlier hand-out and delivered late. A call runs once (a run that dies is run again,
# as any: its own message, same stamp). The room's keys expire this long after the last.
# At least this; longer where a message not yet done with is delivered again later
# (``stamps_kept``): a copy delivered then must still find the stamp.
CLAIMED_KEPT = 3600.0


def stamps_kept(redelivered_after: float | None) -> float:
    """How long a call's stamp is kept once it left the room, where a message not yet
    done with is delivered again after ``redelivered_after`` s (None: never): past that,
    and past a reservation's wait for the message sent on a turn."""
    return max(CLAIMED_KEPT, (redelivered_after or 0.0) + RESERVE)


@dataclass(frozen=True)
class Waiter:
    """A call that wants a turn: ``ident`` (its task id and attempt: a redelivered copy
    has the same), its kept message, its key's weight (its share while others wait), and
    this message's ``stamp`` (0 as first sent; each hand-out sends it with a new one):
    while it waits any message of it may claim its turn; once it left, only its stamp's,
    any other is a copy (its stamp ``kept`` s: ``stamps_kept``)."""

    ident: str
    record: bytes
    weight: float = 1.0
    stamp: int = 0
    kept: float = CLAIMED_KEPT

    @staticmethod
    def ident_of(task_id: str, retries: int) -> str:
        """A call's ident: its task id and attempt (``turn_take.lua`` reads the id back)."""
        return f"{task_id}:{retries}"

    @staticmethod
    def task_id_of(ident: str) -> str:
        """The task id of a call's ident."""
        return ident.rpartition(":")[0] or ident


@dataclass(frozen=True)
class Handed:
    """A call whose turn came: its message to send, with its ``stamp`` (its reservation
    waits for the message of that stamp); or ``given_up``: sent on its turn ``SENDS``
    times (``includes/turns.lua``), never claimed (not sent, or dropped where it came),
    it left the room."""

    ident: str
    record: bytes
    stamp: int = 0

    @property
    def given_up(self) -> bool:
        return self.stamp < 0


@dataclass(frozen=True)
class Kept:
    """The call's message is kept in its key's line: it waits for its turn
    (``started``: a copy, the call's stamp is another message's; this one is dropped)."""

    name: str
    started: bool = False


@dataclass
class Turn:
    """What a call's start found: its leases (its key's slot, the total's) to run now, or
    ``Kept``, or None (its turn is reserved, its key's slot not free yet), or
    ``Contended``: a slot held by a run of the call's own task id (a copy if that run
    lives: the caller's copy rule); and the calls handed a turn meanwhile, to be sent."""

    taken: tuple[Lease, Lease] | Kept | Contended | None
    handed: list[Handed] = field(default_factory=list)


class Turns:
    """The waiting rooms of the tasks' totals on one ``RedisLock`` (``turns_of``).

    Each waiting key has a line of kept messages, and a pass that moves on by 1/weight
    each time it is served (stride scheduling); a freed slot goes to the waiting key of
    the lowest pass whose own limit has room, reserved for the first call in its line
    until that call starts (a reservation is a slot of the total, so the total holds).
    A call leaves the room only as it starts: none is lost. A key's line is named from
    the room's prefix inside the scripts (one server: no Cluster).
    """

    def __init__(self, store: RedisLock) -> None:
        self._store = store
        client = store.client
        self._take = client.register_script(scripts.TURN_TAKE)
        self._hand_out = client.register_script(scripts.TURN_HAND_OUT)
        self._give_back = client.register_script(scripts.TURN_GIVE_BACK)
        self.rooms = f"{store.prefix}:{ROOMS}"

    def _room(self, total: str) -> tuple[list[str], str]:
        """The room's keys (``includes/turns.lua``) and its lines' prefix."""
        tag = self._store.keys(total).lock
        room = f"{tag}:turns"
        keys = [room, f"{room}:calls", f"{room}:of", f"{room}:keys", f"{room}:handed"]
        left = [f"{room}:left", f"{room}:stamps"]
        return [*keys, f"{room}:passes", tag, *left], f"{room}:line:"

    def take(
        self,
        total: str,
        total_limit: int,
        name: str,
        waiter: Waiter,
        *,
        widest: int,
        cap: int | None,
        token: str,
        ttl: float,
        charge: Charge | None = None,
    ) -> Turn:
        """``waiter``'s start: its turn now (``name``'s lowest free slot of ``widest``, at
        most ``cap`` held, and a slot of ``total``), or kept in ``name``'s line; free
        slots handed out meanwhile. One script. ``charge``: the start its rate counted
        for it, given back in that script if it is kept (or a copy), as nothing else
        changed the rate since: a kept call is not charged for a start it did not make."""
        store = self._store
        keys, lines = self._room(total)
        key = f"{store.keys(name).lock}\t{widest}\t{cap or 0}\t{waiter.weight!r}"
        ttl_ms = store.ttl_ms(ttl)
        args: list[str | int | bytes] = [
            lines, waiter.ident, name, key, waiter.record, token, ttl_ms,
            store.ttl_ms(RESERVE), total_limit, total, store.ttl_ms(waiter.kept),
            str(waiter.stamp),
        ]  # fmt: skip
        rate = [] if charge is None else [charge.key]
        if charge is not None:
            args += [charge.left, charge.before]
        sent_at = store.clock.monotonic()
        try:
            reply = self._take(keys=[*keys, self.rooms, *rate], args=args)
        except REDIS_ERRORS as error:
            store.unavailable(error, name)
        kind, handed = int(reply[0]), _handed(reply[5:])
        if kind in {2, 4}:
            return Turn(Kept(name, started=kind == 4), handed)
        if kind == 3:
            return Turn(None, handed)
        if kind == 5:
            tag, n, holder = text(reply[1]), int(reply[2]), text(reply[3])
            own = slot(total if tag == keys[6] else name, n)
            pttl = int(reply[4])
            return Turn(Contended(own, f"{tag}:slot{n}", holder, max(pttl, 0) / 1000 or None))
        own = slot(name, int(reply[2]))
        every = slot(total, int(reply[4]))
        leases = (
            self._granted(own, token, int(reply[1]), ttl_ms, sent_at),
            self._granted(every, token, int(reply[3]), ttl_ms, sent_at),
        )
        return Turn(leases, handed)

    def _granted(self, name: str, token: str, fence: int, ttl_ms: int, sent_at: float) -> Lease:
        store = self._store
        key = store.keys(name).lock
        clock = store.clock
        return Lease.granted(
            name, key, token, fence=fence, ttl=ttl_ms / 1000, sent_at=sent_at, clock=clock
        )

    def hand_out(self, total: str, total_limit: int, ending: Lease | None = None) -> list[Handed]:
        """``ending`` (a run's slot of ``total``, as the run ends) released, and the free
        slots handed out (a sweep: ``ending`` None). The calls handed a turn, to send."""
        store = self._store
        keys, lines = self._room(total)
        slot_key, token = ("", "") if ending is None else (ending.key, ending.token)
        args: list[str | int] = [lines, slot_key, token, store.ttl_ms(RESERVE), total_limit, total]
        try:
            reply = self._hand_out(keys=[*keys, self.rooms], args=args)
        except REDIS_ERRORS as error:
            store.unavailable(error, total)
        return _handed(reply)

    def give_back(
        self,
        total: str,
        total_limit: int,
        ident: str,
        stamp: int | None = None,
        *,
        stays: bool = False,
        kept: float = CLAIMED_KEPT,
    ) -> bool:
        """A reserved call that will not start now (its key paused, its message expired)
        gives its turn back and leaves the room: its message of ``stamp`` (None: any) is
        the one that may come round. ``stays``: it stays first in its key's line (its
        key's slot not free for a while). Its stamp is kept ``kept`` s. Whether it held
        one (a copy holds none)."""
        store = self._store
        keys, lines = self._room(total)
        said = "" if stamp is None else str(stamp)
        kept_ms = store.ttl_ms(kept)
        args: list[str | int] = [lines, ident, total_limit, said, kept_ms, "1" if stays else "0"]
        try:
            done = self._give_back(keys=keys, args=args)
        except REDIS_ERRORS as error:
            store.unavailable(error, total)
        return bool(done)

    def with_calls(self) -> list[str]:
        """The totals whose rooms have calls in them."""
        try:
            found = self._store.client.smembers(self.rooms)
        except REDIS_ERRORS as error:
            self._store.unavailable(error)
        return sorted(text(one) for one in found)

    def kept(self, total: str) -> dict[str, str]:
        """The calls kept in ``total``'s room and not handed a turn yet: ident -> key name."""
        keys, _ = self._room(total)
        try:
            with self._store.client.pipeline(transaction=False) as pipe:
                pipe.hgetall(keys[2])
                pipe.zrange(keys[4], 0, -1)
                of, handed = pipe.execute()
        except REDIS_ERRORS as error:
            self._store.unavailable(error, total)
        sent = {text(ident) for ident in handed}
        return {text(i): text(n) for i, n in of.items() if text(i) not in sent}

    def waiting(self, total: str) -> dict[str, int]:
        """How many calls of each key wait in ``total``'s room (handed ones included)."""
        keys, _ = self._room(total)
        try:
            of = self._store.client.hgetall(keys[2])
        except REDIS_ERRORS as error:
            self._store.unavailable(error, total)
        counts: dict[str, int] = {}
        for name in of.values():
            counts[text(name)] = counts.get(text(name), 0) + 1
        return counts


def _handed(reply: list[object]) -> list[Handed]:
    return [
        Handed(text(reply[i]), _bytes(reply[i + 1]), int(text(reply[i + 2])))
        for i in range(0, len(reply), 3)
    ]


def _bytes(value: object) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def turns_of(store: object) -> Turns | None:
    """The waiting rooms of ``store``: one Redis server other processes reach. None for a
    store in memory, a Redlock, a Cluster (a key's line is named inside the scripts):
    there the total is first come, first served."""
    if not isinstance(store, RedisLock) or not store.on_a_server:
        return None
    if server_of(store.client) is None:
        return None
    return store.helper(Turns)


__all__ = [
    "CLAIMED_KEPT",
    "RESERVE",
    "ROOMS",
    "Handed",
    "Kept",
    "Turn",
    "Turns",
    "Waiter",
    "stamps_kept",
    "turns_of",
]
