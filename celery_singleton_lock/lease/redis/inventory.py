"""Every lock a store holds under its prefix, read in bounded batches: what operators list.

Reading only: SCAN (never KEYS), then one round trip per batch; memory is bounded by the
batch, whatever the count. Bookkeeping keys (fences, wake-up signals, waiter lists,
replaced-token sets) are not locks and are not listed; a name's rate (``rates``) is.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Protocol

from ..errors import store_error
from ..names import MAX_SLOTS, ROLES, Held, LockKeys, companion, parse_key
from ..outcomes import text
from . import scripts
from .calls import Response, run_script
from .clients import SyncClient
from .common import REDIS_ERRORS


class _Store(Protocol):  # RedisLock (this module is below it)
    client: SyncClient
    prefix: str
    where: str


BATCH = 1000

# Each lock of a batch: its value, ttl and fence (lua/read_holds.lua).
READ = scripts.source("read_holds")


def scan(lock: _Store, *, batch: int = BATCH) -> Iterator[Held]:
    """Every lock ``lock``'s store holds under its prefix, a batch at a time.

    Two round trips per batch: SCAN over the prefix (on a Cluster over every master:
    redis-py's cluster client scans each primary), then the batch's holders, time left
    and fences in one: one script on a single server (``lua/read_holds.lua``: 100,000
    locks list in about a second), a pipeline of reads on a Cluster, whose keys span its
    nodes. A lock released meanwhile is left out. Raises the store's errors (unreachable,
    or set up wrongly).
    """
    client, prefix = lock.client, lock.prefix
    unread: list[tuple[str, str, str | None]] = []
    try:
        for raw in client.scan_iter(match=f"{prefix}:{{*", count=batch):
            key = text(raw)
            parsed = parse_key(prefix, key) or _rate_key(prefix, key)
            if parsed is not None:
                unread.append((key, *parsed))
            if len(unread) >= batch:
                yield from _read(lock, unread)
                unread = []
        yield from _read(lock, unread)
    except REDIS_ERRORS as error:
        raise store_error(error, where=lock.where) from error


def family(lock: _Store, name: str) -> Iterator[Held]:
    """The family of the lock ``name`` (a ``Held`` each): its own key, its companions,
    its slots and its rate, read in one round trip (they share its hash tag: one Cluster
    slot)."""
    roles: list[str | None] = [None, *ROLES, *(f"slot{n}" for n in range(1, MAX_SLOTS + 1))]
    found = [
        (LockKeys.build(lock.prefix, companion(name, r) if r else name).lock, name, r)
        for r in roles
    ]
    found.append((LockKeys.build(lock.prefix, name).rate, name, "rate"))
    try:
        yield from _read(lock, found)
    except REDIS_ERRORS as error:
        raise store_error(error, where=lock.where) from error


def _rate_key(prefix: str, key: str) -> tuple[str, str | None] | None:
    """(name, "rate") of a name's rate key (``LockKeys.rate``); None for anything else.
    Listed as role ``"rate"`` with its schedule (the next call's theoretical arrival
    time) for a token."""
    if not key.endswith(":rate"):
        return None
    parsed = parse_key(prefix, key[: -len(":rate")])
    return None if parsed is None or parsed[1] is not None else (parsed[0], "rate")


def _read(lock: _Store, found: list[tuple[str, str, str | None]]) -> Iterator[Held]:
    if not found:
        return
    # Only the lock's own key and its slots are fenced (a pending call's hold and a
    # throttle window keep duplicates out; their executions take fenced leases).
    fences = [
        LockKeys.build(lock.prefix, name).fence if role is None else None for _, name, role in found
    ]
    replies = (
        _pipelined(lock.client, found, fences)
        if hasattr(lock.client, "get_nodes")  # a Cluster: no one script sees every key
        else _scripted(lock.client, found, fences)
    )
    for at, (key, name, role) in enumerate(found):
        value, pttl, fence = replies[3 * at : 3 * at + 3]
        if value is None or isinstance(value, Exception) or isinstance(pttl, Exception):
            continue  # released since the SCAN, or not a lock's value
        yield Held(
            name=name,
            role=role,
            key=key,
            token=text(value),
            ttl=None if int(pttl) < 0 else int(pttl) / 1000,
            fence=int(fence) if fence is not None and not isinstance(fence, Exception) else None,
        )


def _scripted(
    client: SyncClient, found: list[tuple[str, str, str | None]], fences: list[str | None]
) -> Response:
    keys = [key for key, _, _ in found]
    positions = []
    for fence in fences:
        if fence is not None:
            keys.append(fence)
        positions.append(len(keys) if fence is not None else 0)
    reply = run_script(client, client.register_script(READ), keys, positions)
    out: list[Response] = []
    for one in json.loads(text(reply)):
        out += [None] * 3 if one == 0 else [one[0], one[1], one[2] or None]
    return out


def _pipelined(
    client: SyncClient, found: list[tuple[str, str, str | None]], fences: list[str | None]
) -> Response:
    pipe = client.pipeline(transaction=False)
    for (key, _, _), fence in zip(found, fences, strict=True):
        pipe.get(key)
        pipe.pttl(key)
        if fence is not None:
            pipe.get(fence)
    replies = iter(pipe.execute(raise_on_error=False))
    out: list[Response] = []
    for fence in fences:
        out += [next(replies), next(replies), next(replies) if fence is not None else None]
    return out
