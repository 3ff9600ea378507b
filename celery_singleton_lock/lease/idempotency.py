"""Idempotency keys: a caller's key bound to its first call's id and arguments, for a window.

Stripe's keys are the model: the first call is kept for the window (a day by default), a
repeat gets its answer, the same key with other arguments is refused. The records live beside
the locks, under the prefix, outside the locks' own namespace (the lock inventory never lists them).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Literal
from urllib.parse import quote, unquote

from redis.commands.core import Script

from ..exceptions import ConfigurationError
from .redis import scripts
from .redis.common import REDIS_ERRORS
from .redis.store import RedisLock, one_server

# Stripe's bound: a key is an opaque string the caller makes (a UUID, a request's id).
MAX_KEY_LENGTH = 255
# How a call with a key ends: its outcome kept for the window, or the key freed (by a
# run that did not complete, or by a dispatch that sent nothing: ``unsent``).
Outcome = Literal["succeeded", "failed", "forget", "unsent"]
ENDED = ("succeeded", "failed")


@dataclass(frozen=True)
class Claim:
    """An idempotency key's record as a ``claim`` or a ``begin`` found it.

    ``first``: this call was recorded as the key's first (claim), or this run is now
    the one running (begin). ``call``: the id of the call the key is bound to;
    ``state``: accepted, running, succeeded, failed ('' for no record before a begin);
    ``by``: the call whose run set that state.
    """

    first: bool
    call: str
    fingerprint: str
    state: str
    by: str

    @property
    def ended(self) -> bool:
        """The key's work is done: succeeded, or failed and kept (``keep_failures``)."""
        return self.state in ENDED

    def answers_for(self, fingerprint: str) -> bool:
        """Whether this record may answer a call with ``fingerprint`` (the same task and
        arguments as the first call)."""
        return self.fingerprint == fingerprint


@dataclass(frozen=True)
class Record:
    """One key's record, for operators (``celery singleton list --idempotency``)."""

    key: str
    task: str
    call: str
    state: str
    by: str
    accepted_at: float  # seconds since the epoch
    expires_in: float | None  # seconds


def check_key(key: object) -> str:
    """``key`` as given, if it can be an idempotency key; else what to pass instead."""
    if not isinstance(key, str) or not key:
        raise ConfigurationError(
            f"idempotency_key must be a non-empty str (a UUID, a request's id), got {key!r}"
        )
    if len(key) > MAX_KEY_LENGTH:
        raise ConfigurationError(
            f"idempotency_key is {len(key)} characters, more than {MAX_KEY_LENGTH}: use a "
            "UUID or a digest of what identifies the request",
            name=key[:64] + "...",
        )
    return key


def _claim(reply: list[object]) -> Claim:
    first, call, fingerprint, state, by = reply
    return Claim(bool(int(str(first))), _text(call), _text(fingerprint), _text(state), _text(by))


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class IdempotencyKeys:
    """The idempotency keys of one ``RedisLock``: one script, one round trip each.

    A record per key (``lua/idempotency_*.lua`` say its fields) answers three questions:
    which call was first (``claim``), whether a run may do the work or must answer from
    the first one's outcome (``begin``), and how that run ended (``end``).
    """

    def __init__(self, store: RedisLock) -> None:
        self.store = store
        self.prefix = f"{store.prefix}:idempotency:"
        register = store.client.register_script
        self._claim = register(scripts.IDEMPOTENCY_CLAIM)
        self._begin = register(scripts.IDEMPOTENCY_BEGIN)
        self._end = register(scripts.IDEMPOTENCY_END)

    def key(self, idempotency_key: str) -> str:
        """The record's Redis key: the caller's key %-escaped under the prefix, so no key
        can reach outside it (nor name a cluster hash tag)."""
        return self.prefix + quote(check_key(idempotency_key), safe="")

    def claim(
        self, idempotency_key: str, call: str, fingerprint: str, window_ms: int, task: str
    ) -> Claim:
        """Record ``call`` as the key's first, unless a call was first already."""
        return self._run(self._claim, idempotency_key, call, fingerprint, window_ms, task)

    def begin(
        self, idempotency_key: str, call: str, fingerprint: str, window_ms: int, task: str
    ) -> Claim:
        """A run of ``call`` starts (holding its running lease): see ``Claim.first``."""
        return self._run(self._begin, idempotency_key, call, fingerprint, window_ms, task)

    def _run(self, script: Script, key: str, *args: str | int) -> Claim:
        try:
            reply = self.store.pipelining.call(script, [self.key(key)], list(args))
        except REDIS_ERRORS as error:
            self.store.unavailable(error)
        return _claim(reply)

    def end(self, idempotency_key: str, call: str, outcome: Outcome) -> bool:
        """Record how ``call`` ended, or free the key (``forget``); False when the record
        is not that call's to end (taken over, or gone with its window)."""
        try:
            reply = self.store.pipelining.call(
                self._end, [self.key(idempotency_key)], [call, outcome]
            )
        except REDIS_ERRORS as error:
            self.store.unavailable(error)
        return bool(reply)

    def records(self, batch: int = 500) -> Iterator[Record]:
        """Every key's record under the prefix: SCAN, then one pipeline per batch."""
        client = self.store.client
        try:
            scanned = (_text(raw) for raw in client.scan_iter(match=self.prefix + "*", count=batch))
            while chunk := list(islice(scanned, batch)):
                with client.pipeline(transaction=False) as pipe:
                    for name in chunk:
                        pipe.hgetall(name)
                        pipe.pttl(name)
                    replies = pipe.execute()
                for name, fields, pttl in zip(chunk, replies[::2], replies[1::2], strict=True):
                    found = _record(unquote(name[len(self.prefix) :]), fields, pttl)
                    if found is not None:
                        yield found
        except REDIS_ERRORS as error:
            self.store.unavailable(error)

    def read(self, idempotency_key: str) -> Record | None:
        """One key's record, or None."""
        key = self.key(idempotency_key)
        try:
            with self.store.client.pipeline(transaction=False) as pipe:
                pipe.hgetall(key)
                pipe.pttl(key)
                fields, pttl = pipe.execute()
        except REDIS_ERRORS as error:
            self.store.unavailable(error)
        return _record(idempotency_key, fields, pttl)


def _record(key: str, fields: dict[object, object], pttl: int) -> Record | None:
    if not fields:
        return None  # gone since the SCAN
    found = {_text(k): _text(v) for k, v in fields.items()}
    return Record(
        key=key,
        task=found.get("task", ""),
        call=found.get("call", ""),
        state=found.get("state", ""),
        by=found.get("by", ""),
        accepted_at=int(found.get("at", 0)) / 1000,
        expires_in=pttl / 1000 if pttl >= 0 else None,
    )


def idempotency_keys_of(store: object) -> IdempotencyKeys:
    """The idempotency keys of ``store`` (one Redis server: a Redlock refused), made once."""
    return one_server(
        store, "idempotency keys", "one record", "for tasks called with idempotency keys"
    ).helper(IdempotencyKeys)


__all__ = [
    "Claim",
    "IdempotencyKeys",
    "Record",
    "check_key",
    "idempotency_keys_of",
]
