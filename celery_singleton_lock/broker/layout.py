"""kombu's Redis layout, read without consuming: a queue's lists, the unacked hash, the bindings.

For the liveness check of queued holds (``contrib.liveness``): which task ids have a
message waiting in a queue or delivered and not acked. Every key is named whole here,
kombu's ``global_keyprefix`` included, and read on a client that prefixes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Protocol

import redis

BATCH = 500  # list entries and hash fields read per round trip


class KombuChannel(Protocol):
    """What is read of kombu's Redis channel (``kombu.transport.redis.Channel``), each
    pinned by ``tests/unit/test_broker_contract.py``; ``global_keyprefix`` is read when
    it has one."""

    @property
    def client(self) -> redis.Redis: ...
    @property
    def sep(self) -> str: ...
    @property
    def priority_steps(self) -> list[int]: ...
    @property
    def keyprefix_queue(self) -> str: ...
    @property
    def unacked_key(self) -> str: ...


def plain_client(channel: KombuChannel) -> redis.Redis:
    """kombu's channel's client, without its key prefixing (same connection pool).

    kombu's own client prefixes some commands' keys (``LLEN``, ``SMEMBERS``) and not
    others (``LRANGE``, ``HSCAN``, ``SCAN``): here every key is named whole instead."""
    return redis.Redis(connection_pool=channel.client.connection_pool)


def prefix_of(channel: KombuChannel) -> str:
    return str(getattr(channel, "global_keyprefix", "") or "")


def queue_lists(channel: KombuChannel, queue: str) -> list[str]:
    """The lists kombu pops ``queue``'s messages from: the queue's own name for step 0,
    ``<queue><sep><step>`` for the others (kombu's ``_q_for_pri``, pinned by
    ``tests/unit/test_broker_contract.py``)."""
    prefix = prefix_of(channel)
    return [
        prefix + (f"{queue}{channel.sep}{step}" if step else queue)
        for step in channel.priority_steps
    ]


def bound_queues(client: redis.Redis, channel: KombuChannel) -> set[str]:
    """Every queue bound to an exchange on this broker: kombu keeps each exchange's
    bindings in a set (``_kombu.binding.<exchange>``), members ``key<sep>pattern<sep>queue``."""
    prefix = prefix_of(channel)
    pattern = prefix + channel.keyprefix_queue % "*"
    queues: set[str] = set()
    for binding in client.scan_iter(match=pattern, count=BATCH):
        for member in client.smembers(binding):
            text = member.decode() if isinstance(member, bytes) else str(member)
            queues.add(text.split(channel.sep)[-1])
    return queues


def queued(client: redis.Redis, channel: KombuChannel, queue: str) -> Iterator[str | None]:
    """The task id of each message waiting in ``queue`` (None: not a task's)."""
    for name in queue_lists(channel, queue):
        for start in range(0, int(client.llen(name)), BATCH):
            for raw in client.lrange(name, start, start + BATCH - 1):
                yield task_id(raw)


def unacked(client: redis.Redis, channel: KombuChannel) -> Iterator[str | None]:
    """The task id of each message delivered to a worker and not acked yet."""
    key = prefix_of(channel) + channel.unacked_key
    for _, raw in client.hscan_iter(key, count=BATCH):
        yield task_id(raw, unacked=True)


def message_task_id(message: Mapping[str, object]) -> object:
    """A message's task id: Celery's task protocol 2 names the task in the headers,
    protocol 1 only in the correlation id."""
    headers, properties = message.get("headers"), message.get("properties")
    return (headers.get("id") if isinstance(headers, Mapping) else None) or (
        properties.get("correlation_id") if isinstance(properties, Mapping) else None
    )


def task_id(raw: bytes | str, *, unacked: bool = False) -> str | None:
    """The task id of a message as kombu stored it (None: not a task's). An unacked
    hash value is ``[message, exchange, routing key]``."""
    try:
        message = json.loads(raw)
        found = message_task_id(message[0] if unacked else message)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None
    return found if isinstance(found, str) else None
