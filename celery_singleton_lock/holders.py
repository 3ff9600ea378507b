"""Whether a lock's holder is still at work: its process on this host, or its worker asked.

A run that meets its own task id holding the key (a redelivered copy, a retry) asks
before it takes the key over, so a copy never runs beside a live original.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from celery import Celery


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
