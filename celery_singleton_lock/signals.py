"""Signals for metrics and logging, in Celery's own style (``signal.connect(receiver)``).

Sent synchronously in the process where the event happens; a receiver that raises is logged
and ignored (Celery's ``Signal.send`` semantics), so a metrics bug never stops a task. Each
is sent with ``sender=task`` (``limits_changed``: None) and the lock's ``name``.
"""

from __future__ import annotations

import contextvars
import time

from celery.utils.dispatch import Signal

from .lease import Lease

# Receivers get the lock's name as ``name``, and as ``key`` too: its 0.1 spelling, kept
# for one release (it is the lock's name, not its Redis key; read ``name``).
_ARGS = {"name", "key"}

# At dispatch, the call took its hold and was published.
dispatch_accepted = Signal(name="dispatch_accepted", providing_args=_ARGS | {"task_id"})
# At dispatch, a duplicate (the call ``task_id``) was refused.
duplicate_refused = Signal(
    name="duplicate_refused", providing_args=_ARGS | {"task_id", "holder_id"}
)
# At execution, the key was held by someone else; ``decision`` is the policy's ``Fail``,
# ``Requeue`` or ``Wait`` for the run ``task_id``; sent again with ``waited`` True, and
# what it does then, when a wait ran out.
execution_contended = Signal(
    name="execution_contended",
    providing_args=_ARGS | {"task_id", "holder_id", "decision", "waited"},
)
# At execution, the contention policy said ``skip``: the call ended quietly (state IGNORED).
execution_skipped = Signal(
    name="execution_skipped", providing_args=_ARGS | {"task_id", "holder_id"}
)
# At execution, a message carrying the task id of the lock's holder (a redelivery, a
# same-id ``send_task``) was dropped without storing anything under that id.
copy_dropped = Signal(name="copy_dropped", providing_args=_ARGS | {"task_id", "holder_state"})
# The worker's main process released the lease of a pool child that died (``pid``).
dead_child_released = Signal(name="dead_child_released", providing_args=_ARGS | {"task_id", "pid"})
# An execution took its running lease, ``waited`` seconds after it started trying
# (contention included); ``unlocked``: it runs without one (the lock store out of reach,
# ``fail_open``), so nothing is released at its end.
lease_acquired = Signal(
    name="lease_acquired", providing_args=_ARGS | {"task_id", "fence", "waited", "unlocked"}
)
# At execution, a run of a ``rate=`` task was given its ``slot`` (seconds since the epoch,
# the lock store's clock); ``deferred``: not yet, its message was sent again to arrive on
# it, ``delay`` seconds from now. ``remaining`` runs of the key may start now after it;
# the next at ``next_slot``.
rate_asked = Signal(
    name="rate_asked",
    providing_args=_ARGS | {"task_id", "slot", "delay", "deferred", "remaining", "next_slot"},
)
# At dispatch, a rate's ``on_limited="delay"`` reserved the call ``task_id`` its ``slot``
# (seconds since the epoch, the lock store's clock) and sent it with a countdown of
# ``delay`` seconds to arrive on it; ``remaining`` runs of the key may start now after it.
dispatch_deferred = Signal(
    name="dispatch_deferred", providing_args=_ARGS | {"task_id", "slot", "delay", "remaining"}
)
# At dispatch, a rate's ``on_limited="raise"`` refused the call ``task_id`` (nothing sent:
# ``RateLimitedError``, ``retry_after`` seconds), over its rate or ``paused`` by an operator.
dispatch_rate_limited = Signal(
    name="dispatch_rate_limited", providing_args=_ARGS | {"task_id", "retry_after", "paused"}
)
# At dispatch, ``max_pending`` refused the call ``task_id`` (nothing sent:
# ``BackpressureError``): ``waiting`` calls wait for the key already, as many as ``cap``
# allows; a place is likely free after ``retry_after`` seconds.
dispatch_backpressured = Signal(
    name="dispatch_backpressured",
    providing_args=_ARGS | {"task_id", "waiting", "cap", "retry_after"},
)
# At execution, a run of a ``total_limit`` task waits for its turn (round robin across
# keys): its message is kept in its key's line and this delivery ended (Ignore).
waiting_turn = Signal(name="waiting_turn", providing_args=_ARGS | {"task_id"})
# At execution, a run of a key an operator paused (``target``, since ``paused_at``, by
# ``by``) is kept waiting: sent round again every ``recheck`` seconds; told once a call.
call_paused = Signal(
    name="call_paused",
    providing_args=_ARGS | {"task_id", "target", "paused_at", "by", "recheck"},
)
# An execution gave its lease back after ``held`` seconds (sent as the release is sent).
lease_released = Signal(name="lease_released", providing_args=_ARGS | {"task_id", "held"})
# An execution's running lease passed to its retry's message after ``held`` seconds
# (``Task.retry``): the message holds the key now, and the run ends without a release.
lease_handed_over = Signal(name="lease_handed_over", providing_args=_ARGS | {"task_id", "held"})
# Renewal found the lease (its ``fence``) gone while the task ran (``lease_taken``), sent
# from the renewal thread: ``hostname`` is the run's worker's node name.
lease_lost = Signal(name="lease_lost", providing_args=_ARGS | {"task_id", "fence", "hostname"})
# At dispatch, a repeat of an idempotency key was answered with its first call
# (``task_id``, in ``state``: accepted, running, succeeded or failed); nothing was sent.
idempotent_repeat = Signal(
    name="idempotent_repeat", providing_args=_ARGS | {"idempotency_key", "task_id", "state"}
)
# At execution, a copy of a call whose key's work was done ended with the outcome of
# ``answered_by`` without running the body.
idempotent_replayed = Signal(
    name="idempotent_replayed",
    providing_args=_ARGS | {"idempotency_key", "task_id", "answered_by"},
)

# At dispatch, a canvas member found its key held and attached to the holder's call
# (``holder_id``): its message is kept, not sent, until the holder ends.
call_attached = Signal(name="call_attached", providing_args=_ARGS | {"task_id", "holder_id"})
# At execution, an attached call ended with its holder's outcome (``holder_id``), stored
# under its own ``task_id``, without running the body; ``state`` SUCCESS or FAILURE.
attached_answered = Signal(
    name="attached_answered", providing_args=_ARGS | {"task_id", "holder_id", "state"}
)


# An operator changed the limits of ``name`` (a task's name, a key template or a lock name:
# ``limits.set``, ``celery singleton limits set``) in this process, sent with sender=None.
# ``change`` says what ("rate", "limit", "pause", "resume", "reset", or several);
# ``override`` is the ``Override`` now in force.
limits_changed = Signal(name="limits_changed", providing_args=_ARGS | {"change", "override", "by"})


# A worker's broker ride checked itself as the worker started (sent with sender=app, no
# lock's name): ``outcome`` is "passed", "off" (kombu reads otherwise than the ride writes:
# turned off in that worker), "push-refused" (the lock store's user may not push) or
# "not-run" (the check could not run).
ride_checked = Signal(name="ride_checked", providing_args={"outcome"})


def send(signal: Signal, sender: object, name: str, **fields: object) -> None:
    """Send ``signal`` about the lock ``name`` (as ``name``, and as the deprecated ``key``)."""
    signal.send(sender=sender, name=name, key=name, **fields)


def held_since(signal: Signal, sender: object, name: str, task_id: str, acquired: float) -> None:
    """Send ``signal`` (``lease_released``, ``lease_handed_over``) with how long the run
    ``task_id`` held its lease: since ``acquired``, on the monotonic clock."""
    send(signal, sender, name, task_id=task_id, held=time.monotonic() - acquired)


def lease_taken(sender: object, lease: Lease, task_id: str, waited: float) -> None:
    """``lease_acquired`` now, and ``lease_lost`` if renewal later finds it gone (only
    with receivers connected: nothing is registered per task otherwise)."""
    send(
        lease_acquired,
        sender,
        lease.name,
        task_id=task_id,
        fence=lease.fence,
        waited=waited,
        unlocked=not lease.token,
    )
    if lease_lost.receivers:
        # Found lost by the renewal thread: sent in the run's context (its current span),
        # with its worker's name, which Celery keeps per thread in the run's request.
        run = contextvars.copy_context()
        hostname = getattr(getattr(sender, "request", None), "hostname", None)

        def lost(gone: Lease) -> None:
            fields = {"task_id": task_id, "fence": gone.fence, "hostname": hostname}
            run.copy().run(send, lease_lost, sender, gone.name, **fields)

        lease.on_lost(lost)


__all__ = [
    "attached_answered",
    "call_attached",
    "call_paused",
    "copy_dropped",
    "dead_child_released",
    "dispatch_accepted",
    "dispatch_backpressured",
    "dispatch_deferred",
    "dispatch_rate_limited",
    "duplicate_refused",
    "execution_contended",
    "execution_skipped",
    "idempotent_repeat",
    "idempotent_replayed",
    "lease_acquired",
    "lease_handed_over",
    "lease_lost",
    "lease_released",
    "limits_changed",
    "rate_asked",
    "ride_checked",
    "waiting_turn",
]
