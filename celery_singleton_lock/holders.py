"""Whether a lock's holder is still at work: its process on this host, or its worker asked.

A run that meets its own task id holding the key (a redelivered copy, a retry) asks
before it takes the key over, so a copy never runs beside a live original.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from .tokens import read_token

if TYPE_CHECKING:
    from celery import Celery
    from celery.app.task import Context

# How long a run waits for the worker named in a same-id holder's token to say it runs
# that task (a live worker answers in milliseconds; a dead one never does).
ANSWER_TIMEOUT = 1.0


def is_dead(pid: int) -> bool:
    """Gone, or a zombie ("Z": dead but not yet reaped by billiard)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    except (OSError, IndexError):  # no /proc (not Linux): ask the kernel instead
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
    return state in ("Z", "X")


def runs_task(app: Celery, worker: str, task_id: str, timeout: float) -> bool:
    """Whether ``worker`` answers within ``timeout`` that it runs ``task_id`` now.

    One broadcast to that worker alone, answered by its main process (the pool may be
    busy); the call returns at the first reply. No reply (a dead worker, remote control
    off, a broker without broadcast) and any error mean False: nothing can be said.
    """
    try:
        inspect = app.control.inspect(destination=[worker], timeout=timeout, limit=1)
        replies = inspect.query_task(task_id) or {}
    except Exception:  # any failure to ask is "cannot say"
        return False
    return any((tasks or {}).get(task_id, [None])[0] == "active" for tasks in replies.values())


def is_running_copy(app: Celery, request: Context, holder: str, *, retry_of: str | None) -> bool:
    """Whether ``holder`` (a token) is ``request``'s own message running under another
    delivery: same task id, a running lease, and its process or worker says it runs now.

    A dead worker's lease (RabbitMQ redelivers at once when a worker dies, before its
    lease runs out) is not a live original: the delivery contends and runs once it is
    free. A retry's message carries the id too, by design: the attempt that sent it
    (``retry_of``) is contended with like any other holder.
    """
    held = read_token(holder)
    if held.task_id != request.id or held.state != "running" or holder == retry_of:
        return False
    if held.worker == request.hostname:
        # This worker: asking it would find this delivery (Celery tracks requests by
        # task id); the holder's pool child, or this very process, says it directly.
        return held.pid == os.getpid() or (held.pid is not None and not is_dead(held.pid))
    return bool(held.worker) and runs_task(app, str(held.worker), request.id, ANSWER_TIMEOUT)
