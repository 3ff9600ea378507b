"""The message headers and lock tokens the Celery layer writes and reads.

Tokens say who holds a key, so that another process can act for the holder (a worker's main
process frees a dead child's lease by its shape). A redelivered copy of the same task id is
a different execution with a different token, so it can never pass for the owner.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import dataclass

# The lock's name (its wire spelling is older than the name: messages in flight across
# an upgrade keep it).
NAME_HEADER = "singleton_lock_key"
TOKEN_HEADER = "singleton_lock_token"  # noqa: S105  (a header name, not a secret)
ATTEMPT_HEADER = "singleton_lock_attempt"
OUTAGE_HEADER = "singleton_lock_outages"  # requeues so far because the store was unreachable
# An execution requeued this many times for an unreachable store (about an hour with the
# backoff below) fails with LockStoreUnavailableError instead of waiting for ever.
OUTAGE_MAX_REQUEUES = 120
# An apply_async option (popped before publishing) that skips the queue-level hold:
# used to requeue a contended execution, which must not meet its own duplicate check.
BYPASS_OPTION = "singleton_lock_bypass"
# Set on a message published with dedupe=False (a sweep's re-drive of work it believes
# lost), and kept by its requeues: at execution it may take over another message's
# queued hold, never a reservation or a running lease (see ``redrive_shape``).
REDRIVE_HEADER = "singleton_lock_redrive"
# Set on a retry's message: the running token of the attempt that sent it. That attempt
# may still hold the key when the retry starts (its hand-over failed, or it is still
# ending); the retry then contends with it, and is never taken for a copy of it.
RETRY_OF_HEADER = "singleton_lock_retry_of"
# Set when the message's hold is not on its key but on a companion lock beside it (the
# role, e.g. "pending" for lock="until_executing"): at execution the message takes the
# key's running lease afresh and then lets its hold go, so the next call can queue.
HOLD_HEADER = "singleton_lock_hold"
# A throttled call's window token (with ``reopen_on``): the run that fails or is revoked
# gives its window back, and only its own.
WINDOW_HEADER = "singleton_lock_window"
# A rate-limited call's slot (``rate=``), in the lock store's clock's seconds: counted when
# it was reserved (at dispatch, or by the execution that deferred the message), so the
# run only checks it is due and counts nothing again.
RATE_SLOT_HEADER = "singleton_lock_rate_slot"
# When a run first found its key paused (seconds since the epoch; the header's name is
# older than the word "paused"): after the resume it goes as long after the resume as it
# came after the pause, so paused runs go in the order they came, as far apart.
PAUSED_SINCE_HEADER = "singleton_lock_held"
# Put at dispatch on a call that took a place among its key's waiting calls
# (``max_pending``): its run leaves the place as it starts; a resend keeps it.
BACKLOG_HEADER = "singleton_lock_waiting"
# A call whose own countdown or eta is longer than its broker lets a message wait
# unacked is sent to arrive early, with its ETA (seconds since the epoch) here: each
# early arrival is sent on with its hold (``run/eta.py``).
ETA_HEADER = "singleton_lock_eta"
# On a call's message sent again on its turn of a total (``run.in_turn``): the hand-out's
# stamp. Only the message of the call's current stamp starts (a resend passes it on);
# any other, the one it was kept from or one of an earlier hand-out, is dropped.
TURN_HEADER = "singleton_lock_turn"
# One message's journey, not its call's: a retry or a copy of its request starts afresh
# (a resend passes on what it keeps).
CALL_HEADERS = (PAUSED_SINCE_HEADER, BACKLOG_HEADER, TURN_HEADER)
# Put by the worker's main process on the request it hands to its pool (never read
# from a message: the main process drops any a producer sent): the running lease it
# took when the message arrived, for the run to start under without a round trip.
LEASE_HEADER = "singleton_lock_lease"
# Put on an attached call's message as it is sent at its holder's end (never at publish:
# ``publish.attaching``): the holder's task id, whose stored outcome (SUCCESS or FAILURE)
# the run gives as its own instead of running the body (``run.answered``).
ANSWER_HEADER = "singleton_lock_answer"
# The call's idempotency key (``config/idempotency_options.py``): its work is done once per key.
IDEMPOTENCY_HEADER = "singleton_lock_idempotency_key"


# RabbitMQ's dead-lettering headers. A message sent again is a new message: carrying its
# request's would make RabbitMQ read a cycle of deaths into it (celery#9867).
DEAD_LETTER_HEADERS = frozenset({
    "x-death",
    "x-first-death-exchange",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-last-death-exchange",
    "x-last-death-queue",
    "x-last-death-reason",
})  # fmt: skip


def carried_headers(request_headers: Mapping[str, object] | None) -> dict[str, object]:
    """The headers a message sent again keeps from its request: all but the dead-lettering
    ones (``x-death``...)."""
    if not request_headers:
        return {}
    return {k: v for k, v in request_headers.items() if k not in DEAD_LETTER_HEADERS}


@dataclass(frozen=True)
class HandedLease:
    """The running lease a worker's main process took for a message, as handed to the run.

    ``fence`` is None when the main process could not read its answer: the run then takes
    the key over from ``token`` itself (one round trip), whoever holds it now.
    """

    name: str
    key: str
    token: str
    fence: int | None
    ttl: float
    # When it expires unless renewed, on time.monotonic()'s clock: one clock for every
    # process of the host (CLOCK_MONOTONIC), so a pool child reads it as it was meant.
    expires_at: float

    def wire(self) -> dict[str, object]:
        return {
            "name": self.name,
            "key": self.key,
            "token": self.token,
            "fence": self.fence,
            "ttl": self.ttl,
            "expires_at": self.expires_at,
        }

    @classmethod
    def take(cls, request: object, task_id: str) -> HandedLease | None:
        """The lease handed with the running request, if any and if it is this task's;
        taken out of the request, so that nothing sent from it (a retry, a requeue,
        which copy the request's headers) carries it on.

        A pool in the worker's own process gets the main process's ``Handoff`` itself
        (``worker/request.py``), read now; a child process gets what it was when the
        request was pickled for it.
        """
        value = getattr(request, LEASE_HEADER, None)
        headers = getattr(request, "headers", None)
        if isinstance(headers, dict):
            headers.pop(LEASE_HEADER, None)
        if value is not None:
            setattr(request, LEASE_HEADER, None)
        resolve = getattr(value, "resolve", None)
        if callable(resolve):
            value = resolve()
        if not isinstance(value, dict) or not value:
            return None
        try:
            fence = value["fence"]
            handed = cls(
                name=str(value["name"]),
                key=str(value["key"]),
                token=str(value["token"]),
                fence=None if fence is None else int(fence),
                ttl=float(value["ttl"]),
                expires_at=float(value["expires_at"]),
            )
        except (KeyError, TypeError, ValueError):
            return None
        return handed if read_token(handed.token).task_id == task_id else None


def _nonce() -> str:
    # Tells apart two holds of one task id (a task_id= reused by the caller); it needs
    # to be unique, not secret. random reseeds in a forked child, and unlike secrets
    # it costs no system call on the dispatch path. It starts with when it was made (ms
    # since the epoch), which is how `celery singleton list` tells a hold's age.
    return f"{int(time.time() * 1000)}-{random.getrandbits(32):08x}"


def queued_token(task_id: str) -> str:
    """A queued hold, taken at dispatch: ``q|<nonce>|<task id>``."""
    return f"q|{_nonce()}|{task_id}"


def requeue_token(task_id: str, queued: str | None, attempt: int) -> str:
    """The queued hold a running message passes to its requeue, sent as ``attempt``."""
    return _passed(task_id, queued, str(attempt))


def retry_token(task_id: str, queued: str | None, retries: int) -> str:
    """The queued hold a running attempt (``retries`` so far) passes to its retry."""
    return _passed(task_id, queued, f"r{retries + 1}")


def retry_shape(task_id: str, queued: str | None, retries: int) -> tuple[str, str]:
    """(prefix, suffix) of the hold ``retry_token`` names, for the worker's main process
    to free it after the attempt's pool child died: that token exactly, or for a message
    without a queued hold of its own (nothing to name it from) any queued hold of this
    task id's retry, which only another copy of the same task id (a reused ``task_id=``,
    a redelivery) waiting out its retry at the same count could also have: so the worker
    looks for the child's own lease on every slot first."""
    step = f"r{retries + 1}"
    if _first_nonce(queued) is None:
        return "q|", f"+{step}|{task_id}"
    return _passed(task_id, queued, step), ""


def _passed(task_id: str, queued: str | None, step: str) -> str:
    # Named from the running message's own queued hold and which send it is, so that the
    # worker's main process can name it too: a pool child killed between passing the
    # hold and sending the message leaves a hold no message carries, which the main
    # process then frees (worker/request.py) rather than leave the key held for
    # queue_ttl. It cannot tell that window from a death just after the send: then the
    # message sent waits without its hold (a later call may queue beside it; the runs
    # still never overlap), the lesser harm. A message without a queued hold of its own
    # (no dispatch check: while_executing, limit) passes to a fresh nonce with the same
    # step, which the main process finds by that step (``retry_shape``). Its age (a
    # hold's "since") is the first message's: how long the call has been waiting.
    first = _first_nonce(queued) or _nonce()
    return f"q|{first}+{step}|{task_id}"


def _first_nonce(queued: str | None) -> str | None:
    """The first message's nonce in a queued hold, whatever sends came since (a
    debounce's burst is over); None for no queued hold."""
    parts = (queued or "").split("|", 2)
    if len(parts) != 3 or parts[0] != "q" or not parts[1]:
        return None
    return parts[1].partition("~")[0].partition("+")[0]


def debounced_token(task_id: str, burst_began: float) -> str:
    """A queued hold of a debounced call: its nonce also carries when the burst began
    (ms since the epoch), which later calls of the burst read to honour ``max_wait``."""
    return f"q|{_nonce()}~{int(burst_began * 1000)}|{task_id}"


def burst_began(token: str) -> float | None:
    """When the burst of a debounced call's hold began (queued or reserved), or None."""
    parts = token.split("|")
    nonce = parts[1] if token.startswith("q|") and len(parts) == 3 else None
    if token.startswith("r|") and len(parts) == 4:
        nonce = parts[2]
    _, sep, began = (nonce or "").partition("~")
    return int(began) / 1000 if sep and began.isdigit() else None


def redrive_shape() -> tuple[str, str]:
    """(prefix, suffix) of any queued hold: what a re-drive may take over at execution.

    A queued hold whose message sits in the prefetch of a worker killed before it could
    reserve it lasts ``queue_ttl`` (the broker gives the message back only after its
    visibility timeout). A re-drive runs past it; nothing is running under a queued
    hold, so no two executions overlap, and the hold's own message, when it comes back,
    meets the key like any other copy.
    """
    return "q|", ""


def reserved_shape(hostname: str, task_id: str) -> tuple[str, str]:
    """(prefix, suffix) of a worker's reservation of a message it received."""
    return f"r|{hostname}|", f"|{task_id}"


def reserved_token(task_id: str, hostname: str, queued: str) -> str:
    """The reservation of the message whose queued hold is ``queued``: it keeps that
    hold's nonce, so the message's execution can name it exactly (another message of
    the same task id, e.g. a replacement of its arguments, never matches it).

    ``r|<host>|<nonce>|<task id>``, once a worker has received the message: its main
    process renews that reservation, so a worker that dies with prefetched messages frees
    their keys within ``ttl`` (see ``worker/request.py``)."""
    prefix, suffix = reserved_shape(hostname, task_id)
    return f"{prefix}{_nonce_of(queued)}{suffix}"


def reserved_exact(task_id: str, queued: str) -> tuple[str, str]:
    """(prefix, suffix) matching the reservation made from ``queued`` alone, on whatever
    host: the hold's nonce and the task id name the message. (The host is left out: a
    worker's main process and its executions may spell it differently, e.g. Celery's
    in-process test worker gives its tasks the machine's name, not its node name.)"""
    return "r|", f"|{_nonce_of(queued)}|{task_id}"


def is_reservation_of(token: str, task_id: str, queued: str) -> bool:
    """Whether ``token`` is the reservation made from the queued hold ``queued``."""
    prefix, suffix = reserved_exact(task_id, queued)
    return token.startswith(prefix) and token.endswith(suffix) and token.count("|") == 3


def queued_form(token: str) -> str:
    """The queued hold a reservation was made from (it keeps the hold's nonce)."""
    parts = token.split("|")
    if token.startswith("r|") and len(parts) == 4:
        return f"q|{parts[2]}|{parts[3]}"
    return token


def _nonce_of(queued: str) -> str:
    parts = queued.split("|", 2)
    return parts[1] if len(parts) == 3 and parts[0] == "q" and parts[1] else _nonce()


def running_prefix(hostname: str, pid: int) -> str:
    return f"x|{hostname}|{pid}|"


def running_token(task_id: str, hostname: str, pid: int) -> str:
    """A running lease: ``x|<host>|<pid>|<nonce>|<task id>``.

    Where the mode allows, the worker's main process takes the running lease itself as
    the message arrives (under its own pid) and hands it to the run (``LEASE_HEADER``)
    instead of reserving. The main process releases a dead child's lease by its shape
    (see ``worker.SingletonRequest``)."""
    return f"{running_prefix(hostname, pid)}{_nonce()}|{task_id}"


def holder_task_id(token: str | None) -> str | None:
    """The task id inside a holder's token; None for a foreign value."""
    return read_token(token).task_id


@dataclass(frozen=True)
class Holder:
    """What a lock's token says of its holder (None where it does not say)."""

    state: str | None  # "queued", "reserved" or "running"; None: not a token of ours
    task_id: str | None = None
    worker: str | None = None
    pid: int | None = None
    since: float | None = None  # when the hold was taken (s since the epoch)


# (state, fields in the token): q|nonce|id, r|host|nonce|id, x|host|pid|nonce|id
_SHAPES = {"q": ("queued", 3), "r": ("reserved", 4), "x": ("running", 5)}


def read_token(token: str | None) -> Holder:
    """The holder a token names; ``Holder(None)`` for a value this library did not write."""
    shape = _SHAPES.get(token[:1]) if token and token[1:2] == "|" else None
    if token is None or shape is None:
        return Holder(None)
    state, fields = shape
    parts = token.split("|", fields - 1)
    if len(parts) != fields or not parts[-1]:
        return Holder(None)
    pid = parts[2] if state == "running" else ""
    head = parts[-2].partition("-")[0]
    return Holder(
        state,
        task_id=parts[-1],
        worker=parts[1] if state != "queued" else None,
        pid=int(pid) if pid.isdigit() else None,
        # A nonce from before 0.1 (12 hex digits) has no time: the age is unknown.
        since=int(head) / 1000 if head.isdigit() and len(head) >= 12 else None,
    )


def _header(request: object, name: str) -> object:
    if isinstance(request, Mapping):  # a message's headers themselves
        return request.get(name)
    headers = getattr(request, "headers", None) or {}
    value = headers.get(name)
    return getattr(request, name, None) if value is None else value


def header(request: object, name: str) -> str | None:
    """A text header of the running request (or of a message's headers), in the worker
    and eagerly alike; None when absent or not text (a message this library did not
    write)."""
    value = _header(request, name)
    return value if isinstance(value, str) else None


def header_count(request: object, name: str) -> int:
    """A count header of the running request (attempts, outages, a re-drive's mark); 0
    when absent or not a whole number."""
    value = _header(request, name)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return 0
    try:
        return int(value)
    except ValueError:
        return 0


def holder_state(held: object) -> str:
    """The state of a ``Contended``'s holder for log lines: queued, reserved, running,
    throttled (a throttle window), or unknown (a value this library did not write)."""
    if str(getattr(held, "key", "")).endswith(":throttle"):
        return "throttled"
    return read_token(getattr(held, "holder", None)).state or "unknown"


def slot_header(at: float, reserved_at: float) -> str:
    """A rate slot as it rides in a message: the slot, and when it was reserved (both
    seconds since the epoch); a pause's end moves a slot reserved before it."""
    return f"{at:.6f};{reserved_at:.6f}"


def read_slot(value: object) -> tuple[float, float] | None:
    """(slot, reserved at) of a ``slot_header`` (an older message's: reserved at 0)."""
    if value is None:
        return None
    at, _, reserved = str(value).partition(";")
    try:
        return float(at), float(reserved or 0.0)
    except ValueError:
        return None
