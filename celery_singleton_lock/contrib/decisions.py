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


@dataclass(frozen=True)
class Told:
    """One decision as monitors see it: ``what`` (``refused``, ``copy-dropped``...), the
    signal it is read from, and its fields from the signal's (None: this signal's send was
    not that decision, e.g. a rate's slot given now). ``at_dispatch``: made in a producer."""

    what: str
    signal: Signal
    fields: Callable[[Mapping[str, object]], Fields | None]
    at_dispatch: bool = False

    @property
    def event_type(self) -> str:
        """The Celery event's type, for receivers and ``celery events --dump``."""
        return f"singleton-{self.what}"

    @property
    def task_event_type(self) -> str:
        """The same event in Celery's ``task`` group, sent beside it: Celery's own state
        (Flower, ``celery events``' monitor) files an event under the call it names only
        when its type is ``task-...``."""
        return f"task-{self.event_type}"

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
    fields["reason"] = f"{sent['name']!r} is held by {holder or 'a call'}: {told}"
    return fields


def _deferred(sent: Mapping[str, object]) -> Fields | None:
    if not sent.get("deferred"):
        return None  # a slot now: the run goes on
    delay = float(sent.get("delay") or 0.0)  # type: ignore[arg-type]
    return {
        "uuid": sent.get("task_id"),
        "key": sent["name"],
        "slot": sent.get("slot"),
        "delay": delay,
        "remaining": sent.get("remaining"),
        "reason": f"{sent['name']!r}'s rate: deferred {delay:.3f}s to its slot",
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


DECISIONS: tuple[Told, ...] = (
    Told("refused", singleton_signals.duplicate_refused, _refused, at_dispatch=True),
    Told("contended", singleton_signals.execution_contended, _contended),
    Told("deferred", singleton_signals.rate_asked, _deferred),
    Told("copy-dropped", singleton_signals.copy_dropped, _copy_dropped),
    Told("lease-lost", singleton_signals.lease_lost, _lease_lost),
    # A canvas member joined to its key's holder at dispatch (docs/modes.md).
    Told("attached", singleton_signals.call_attached, _attached, at_dispatch=True),
)
