"""The decisions as OpenTelemetry span events on the current span (the extra ``[otel]``).

Each of ``DECISIONS`` is ``singleton.<what>`` on the caller's span at dispatch, the run's at
execution (``opentelemetry-instrumentation-celery``'s); a run's span gets its fence. Nothing
is connected without ``opentelemetry-api``; a span that does not record is left at once.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping

from .. import signals as singleton_signals
from .decisions import DECISIONS, Told

# Celery events' field names, as OpenTelemetry attributes (the rest keep theirs).
ATTRIBUTES = {"key": "singleton.key", "holder": "singleton.holder_id", "uuid": "singleton.task_id"}


def available() -> bool:
    """Whether ``opentelemetry-api`` is installed: its ``opentelemetry.trace``, not only
    the ``opentelemetry`` namespace, which another distribution may provide alone."""
    try:
        return importlib.util.find_spec("opentelemetry.trace") is not None
    except ImportError:  # no ``opentelemetry`` at all (a parent's find_spec imports it)
        return False


def install() -> bool:
    """Connect the receivers where ``opentelemetry-api`` is installed (idempotent).
    Returns whether it is."""
    if not available():
        return False
    for told in DECISIONS:
        told.signal.connect(
            _receiver(told), weak=False, dispatch_uid=f"celery_singleton_lock.span.{told.what}"
        )
    singleton_signals.lease_acquired.connect(
        _lease_taken(), weak=False, dispatch_uid="celery_singleton_lock.span.lease"
    )
    return True


def attributes(fields: Mapping[str, object]) -> dict[str, str | int | float | bool]:
    """A decision's fields as span attributes: ``singleton.key``, ``singleton.holder_id``,
    and its figures under ``singleton.`` (a value OpenTelemetry cannot hold as text)."""
    said: dict[str, str | int | float | bool] = {}
    for name, value in fields.items():
        if value is None:
            continue
        attribute = ATTRIBUTES.get(name, f"singleton.{name}")
        said[attribute] = value if isinstance(value, (str, int, float, bool)) else str(value)
    return said


def _receiver(told: Told) -> Callable[..., None]:
    # Imported once here, not per decision: a span that does not record costs one call.
    from opentelemetry.trace import get_current_span  # noqa: PLC0415  (an optional extra)

    def receive(sender: object = None, **sent: object) -> None:
        span = get_current_span()
        if not span.is_recording():
            return
        fields = told.fields(sent)
        if fields is not None:
            span.add_event(told.span_event, attributes(fields))

    return receive


def _lease_taken() -> Callable[..., None]:
    # Imported once here, as for the decisions: a run whose span does not record (no
    # tracer provider set) pays one call for it.
    from opentelemetry.trace import get_current_span  # noqa: PLC0415  (an optional extra)

    def taken(sender: object = None, name: str = "", fence: object = None, **_: object) -> None:
        span = get_current_span()
        if span.is_recording():
            span.set_attribute("singleton.key", name)
            if isinstance(fence, int):
                span.set_attribute("singleton.fence", fence)

    return taken
