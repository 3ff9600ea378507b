"""What each decision about a call kept from running says, once: its name and fields.

Celery events (``contrib/events.py``) and OpenTelemetry (``contrib/tracing.py``) both read
``DECISIONS``; docs/operations.md lists the names and fields.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from celery.utils.dispatch import Signal

from .. import signals as singleton_signals
from ..policies import Requeue, Wait, described

Fields = dict[str, object]

# The twin of a decision after which the call may still run: Celery's state ranks any
# state it does not know above RECEIVED, STARTED and REVOKED, so a ``task-singleton-...``
# status would stay while the call later runs, or for ever once revoked. ``task-pending``
# (a state, PENDING, ranked below all of them) leaves the status Celery's own and merges
# the fields: Flower shows the decision in words as the call's result, and Celery's later
# events (received, started, revoked, succeeded) win as they would without it.
GOES_ON_TWIN = "task-pending"


def _goes_on(fields: Mapping[str, object]) -> bool | None:
    return False


@dataclass(frozen=True)
class Told:
    """One decision as monitors see it: ``what`` (``refused``, ``copy-dropped``...), the
    signal it is read from, and its fields from the signal's (None: this signal's send was
    not that decision, e.g. a rate's slot given now). ``at_dispatch``: made in a producer."""

    what: str
    signal: Signal
    fields: Callable[[Mapping[str, object]], Fields | None]
    at_dispatch: bool = False
    # Whether the call's story under its id ends here (True: its status says the
    # decision), goes on (False: its status stays Celery's), or is not this call's
    # (None: no twin in Celery's task group).
    ends: Callable[[Mapping[str, object]], bool | None] = _goes_on

    @property
    def event_type(self) -> str:
        """The Celery event's type, for receivers and ``celery events --dump``."""
        return f"singleton-{self.what}"

    def task_event_type(self, fields: Mapping[str, object]) -> str | None:
        """The same event in Celery's ``task`` group, sent beside it: Celery's own state
        (Flower, ``celery events``' monitor) files an event under the call it names only
        when its type is ``task-...``. ``task-singleton-<what>`` (a status of its own)
        where the call's story ends with it, ``GOES_ON_TWIN`` where the call may still
        run, None where the event names another call's id (a copy's, its holder's)."""
        ends = self.ends(fields)
        if ends is None:
            return None
        return f"task-{self.event_type}" if ends else GOES_ON_TWIN

    @property
    def span_event(self) -> str:
        """The OpenTelemetry span event's name."""
        return "singleton." + self.what.replace("-", "_")


def _refused(sent: Mapping[str, object]) -> Fields:
    holder = sent.get("holder_id")
    return {
        "uuid": sent.get("task_id"),
        "key": sent["name"],
        "holder": holder,
        "reason": f"refused at dispatch: {sent['name']!r} is held by {holder or 'a call'}",
    }


def _contended(sent: Mapping[str, object]) -> Fields:
    decision, holder = sent.get("decision"), sent.get("holder_id")
    fields: Fields = {"uuid": sent.get("task_id"), "key": sent["name"], "holder": holder}
    then = "unknown"
    if decision is not None:
        then = type(decision).__name__.lower()
    if isinstance(decision, Requeue):
        fields["delay"] = decision.countdown
    if isinstance(decision, Wait):
        fields["timeout"] = decision.timeout
    fields["then"] = then
    told = described(decision) if isinstance(decision, (Requeue, Wait)) else then
    if sent.get("waited"):
        fields["waited"] = True  # told again: its wait ran out, and this is what it does
        told = f"waited in vain, then {told}"
    fields["reason"] = f"{sent['name']!r} is held by {holder or 'a call'}: {told}"
    return fields


def _ends_unless_run_later(fields: Mapping[str, object]) -> bool:
    # A failed or skipped call ends here; a requeued or waiting one runs later.
    return fields.get("then") in {"fail", "skip"}


def _deferred(sent: Mapping[str, object], where: str = "") -> Fields | None:
    if not sent.get("deferred"):
        return None  # a slot now: the run goes on
    delay = float(sent.get("delay") or 0.0)  # type: ignore[arg-type]
    return {
        "uuid": sent.get("task_id"),
        "key": sent["name"],
        "slot": sent.get("slot"),
        "delay": delay,
        "remaining": sent.get("remaining"),
        "reason": f"{sent['name']!r}'s rate: deferred {delay:.3f}s to its slot{where}",
    }


def _deferred_at_dispatch(sent: Mapping[str, object]) -> Fields | None:
    return _deferred({**sent, "deferred": True}, " at dispatch")


def _rate_limited(sent: Mapping[str, object]) -> Fields:
    retry_after = float(sent.get("retry_after") or 0.0)  # type: ignore[arg-type]
    why = "paused by an operator" if sent.get("paused") else "over its rate"
    return {
        "uuid": sent.get("task_id"),
        "key": sent["name"],
        "retry_after": retry_after,
        "paused": bool(sent.get("paused")),
        "reason": f"refused at dispatch: {sent['name']!r} is {why}; "
        f"try again in {retry_after:.3f}s",
    }


def _backpressured(sent: Mapping[str, object]) -> Fields:
    retry_after = float(sent.get("retry_after") or 0.0)  # type: ignore[arg-type]
    waiting, cap = sent.get("waiting"), sent.get("cap")
    return {
        "uuid": sent.get("task_id"),
        "key": sent["name"],
        "waiting": waiting,
        "cap": cap,
        "retry_after": retry_after,
        "reason": f"refused at dispatch: {sent['name']!r} has {waiting} calls waiting, "
        f"as many as max_pending={cap} allows; try again in {retry_after:.3f}s",
    }


def _waiting_turn(sent: Mapping[str, object]) -> Fields:
    return {
        "uuid": sent.get("task_id"),
        "key": sent["name"],
        "reason": f"waits for its turn of its task's total_limit, kept in {sent['name']!r}'s line",
    }


def _paused(sent: Mapping[str, object]) -> Fields:
    target, by = sent.get("target"), sent.get("by")
    return {
        "uuid": sent.get("task_id"),
        "key": sent["name"],
        "target": target,
        "paused_at": sent.get("paused_at"),
        "by": by or None,
        "recheck": sent.get("recheck"),
        "reason": f"{sent['name']!r} is paused by an operator ({target!r}"
        + (f", {by}" if by else "")
        + "): kept waiting until it is resumed",
    }


def _copy_dropped(sent: Mapping[str, object]) -> Fields:
    # A copy carries its holder's own task id: the holder is the call itself.
    return {
        "uuid": sent.get("task_id"),
        "key": sent["name"],
        "holder": sent.get("task_id"),
        "holder_state": sent.get("holder_state"),
        "reason": f"a copy of this call, delivered again, dropped: it holds {sent['name']!r}",
    }


def _lease_lost(sent: Mapping[str, object]) -> Fields:
    return {
        "uuid": sent.get("task_id"),
        "key": sent["name"],
        "fence": sent.get("fence"),
        "reason": f"lost its lease of {sent['name']!r} while it ran (fence {sent.get('fence')})",
    }


def _attached(sent: Mapping[str, object]) -> Fields:
    holder = sent.get("holder_id")
    return {
        "uuid": sent.get("task_id"),
        "key": sent["name"],
        "holder": holder,
        "reason": f"attached to {holder or 'the holder'} of {sent['name']!r}",
    }


def _ends(fields: Mapping[str, object]) -> bool:
    return True


def _not_this_call(fields: Mapping[str, object]) -> None:
    # A copy carries its holder's id: a twin would file the drop under the running holder.
    return None


DECISIONS: tuple[Told, ...] = (
    Told("refused", singleton_signals.duplicate_refused, _refused, at_dispatch=True, ends=_ends),
    Told(
        "contended",
        singleton_signals.execution_contended,
        _contended,
        ends=_ends_unless_run_later,
    ),
    Told("deferred", singleton_signals.rate_asked, _deferred),
    # The same decision as its producer makes it (``on_limited="delay"``).
    Told("deferred", singleton_signals.dispatch_deferred, _deferred_at_dispatch, at_dispatch=True),
    # ``on_limited="raise"``: nothing sent, the caller told (not a duplicate: no holder).
    Told(
        "rate-limited",
        singleton_signals.dispatch_rate_limited,
        _rate_limited,
        at_dispatch=True,
        ends=_ends,
    ),
    # ``max_pending``: nothing sent, the caller told (``BackpressureError``).
    Told(
        "backpressured",
        singleton_signals.dispatch_backpressured,
        _backpressured,
        at_dispatch=True,
        ends=_ends,
    ),
    Told("waiting-turn", singleton_signals.waiting_turn, _waiting_turn),
    Told("paused", singleton_signals.call_paused, _paused),
    Told("copy-dropped", singleton_signals.copy_dropped, _copy_dropped, ends=_not_this_call),
    Told("lease-lost", singleton_signals.lease_lost, _lease_lost),
    # A canvas member joined to its key's holder at dispatch (docs/modes.md).
    Told("attached", singleton_signals.call_attached, _attached, at_dispatch=True),
)
