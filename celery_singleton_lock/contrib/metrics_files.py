"""A worker's Prometheus multiprocess files as its scrape reads them: the live gauges of
the processes gone dropped first (``metrics_server.serve_worker``)."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric


class LiveOnly:
    """A worker's multiprocess files as a scrape reads them, the gauges of processes gone
    dropped first: a pool child killed while it held a lease (a hard time limit, a
    terminating revoke, the OOM killer) never says it let go."""

    def __init__(self, path: str) -> None:
        from prometheus_client import multiprocess  # noqa: PLC0415  (after the mode is set)

        self.path = path
        self.files = multiprocess.MultiProcessCollector(None, path)  # type: ignore[no-untyped-call]

    def collect(self) -> Iterable[Metric]:
        from prometheus_client import multiprocess  # noqa: PLC0415

        for pid in _pids_with_live_gauges(self.path):
            if not alive(pid):
                multiprocess.mark_process_dead(pid, self.path)  # type: ignore[no-untyped-call]
        collected: Iterable[Metric] = self.files.collect()  # type: ignore[no-untyped-call]
        return collected


def _pids_with_live_gauges(path: str) -> set[int]:
    # prometheus_client names them gauge_<mode>_<pid>.db, a live mode's starting "live".
    names = (os.path.basename(found) for found in glob.glob(os.path.join(path, "gauge_live*.db")))
    return {int(name[:-3].rsplit("_", 1)[1]) for name in names}


def alive(pid: int) -> bool:
    """Whether the process ``pid`` is there and has not ended."""
    try:
        os.kill(pid, 0)  # no signal sent: whether the process is there
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's: the pid was taken again, by something alive
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """Dead, not yet reaped (billiard reaps its children on its own timer), where Linux's
    /proc says so."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False
