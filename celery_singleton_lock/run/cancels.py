"""A run cancelled by a newer call (``on_duplicate="cancel"``): its hook, its hard stop, its end.

The lease learns it (``Lease.yield_to``: the renewal finds the key's pending call). A run
that stops by raising ``TaskCancelledError`` (``self.lease.check()``) ends in REVOKED: not
FAILURE, not retried, and not SUCCESS with half its work done.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Protocol

from celery.exceptions import Ignore, Reject

from ..config.options import SingletonOptions
from ..exceptions import TaskCancelledError
from ..lease import Lease

if TYPE_CHECKING:
    from celery import Celery
    from celery.app.task import Context
    from celery.backends.base import Backend

logger = logging.getLogger(__name__)


class Cancellable(Protocol):
    """What of a ``SingletonTask`` a cancelled run needs (not imported: it imports us)."""

    name: str
    app: Celery
    backend: Backend
    ignore_result: bool

    def singleton_options(self) -> SingletonOptions: ...

    def on_cancel(self, task_id: str, lease: Lease) -> None: ...


def watch(task: Cancellable, request: Context, lease: Lease) -> None:
    """Call ``task.on_cancel`` once ``lease`` is cancelled, and terminate the run if the
    task says so (nothing for a lease that yields to nothing).

    With ``terminate_on_cancel`` the worker is asked, through Celery's remote control, to
    terminate the run (``revoke(terminate=True)``: prefork); its main process stores
    REVOKED and releases the dead child's lease, as for any terminated run."""
    if lease.yields_to is None:
        return
    task_id, hostname = request.id, request.hostname
    terminate = task.singleton_options().terminate_on_cancel and not request.is_eager

    def cancelled(_: Lease) -> None:
        try:
            task.on_cancel(task_id, lease)
        finally:
            if terminate:
                logger.info("terminating %s[%s]: cancelled by a newer call", task.name, task_id)
                task.app.control.revoke(task_id, terminate=True, destination=[hostname])

    # Not on the renewal thread that noticed: a hook that blocks must not delay renewals.
    lease.on_cancel(
        lambda _: threading.Thread(target=cancelled, args=(lease,), daemon=True).start()
    )


def ended(task: Cancellable, request: Context, error: Exception, lease: Lease) -> None:
    """A run that raised: its own lease's ``TaskCancelledError`` ends it in REVOKED (raises
    ``Ignore`` so that Celery stores nothing over it), also when it came from a retry
    the task tried (``autoretry_for``), which a cancelled run does not send
    (``SingletonTask.apply_async``); anything else is left as it is."""
    if isinstance(error, Reject) and isinstance(error.reason, TaskCancelledError):
        error = error.reason  # Celery's retry wraps what refusing to send the retry raised
    if not isinstance(error, TaskCancelledError) or error.key != lease.key or not lease.cancelled:
        return
    logger.info("%s[%s] stopped: %s", task.name, request.id, error)
    if not (request.is_eager or task.ignore_result or getattr(request, "ignore_result", False)):
        task.backend.mark_as_revoked(request.id, str(error), request=request)
    raise Ignore(str(error)) from error
