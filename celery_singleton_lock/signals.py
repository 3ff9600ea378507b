"""Signals for metrics and logging, in Celery's own style (``signal.connect(receiver)``).

Sent synchronously in the process where the event happens; a receiver that raises is
logged and ignored (Celery's ``Signal.send`` semantics), so a metrics bug never stops a
task.

- ``duplicate_refused(sender=task, key, holder_id)``: at dispatch, a duplicate was refused.
- ``execution_contended(sender=task, key, holder_id, decision)``: at execution, the key was
  held by someone else; ``decision`` is the policy's ``Fail``, ``Requeue`` or ``Wait``.
- ``dead_child_released(sender=task, key, task_id, pid)``: the worker's main process
  released the lease of a pool child that died.
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

duplicate_refused = Signal(name="duplicate_refused", providing_args={"key", "holder_id"})
execution_contended = Signal(
    name="execution_contended", providing_args={"key", "holder_id", "decision"}
)
dead_child_released = Signal(name="dead_child_released", providing_args={"key", "task_id", "pid"})

__all__ = ["dead_child_released", "duplicate_refused", "execution_contended"]
