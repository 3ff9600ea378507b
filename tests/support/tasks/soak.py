"""The mode soak (tests/chaos/test_mode_soak.py): one task per mode, every one on the
same workers, as a production app's task types share them."""

from __future__ import annotations

import time
from typing import Any

from celery_singleton_lock import requeue, singleton_task, wait

from ..celery_app import app, task_name
from .records import begin, record

_SOAK_CONTENTION = requeue(max_tries=2000, backoff=0.05, cap=0.3)
SOAK_MODES: dict[str, dict[str, Any]] = {
    "until_executing": {"lock": "until_executing", "on_contention": _SOAK_CONTENTION},
    "replace": {
        "lock": "until_executing", "on_duplicate": "replace", "on_contention": _SOAK_CONTENTION
    },
    "debounce": {"debounce": 0.2, "on_contention": _SOAK_CONTENTION},
    "throttle": {"throttle": 0.3, "on_contention": _SOAK_CONTENTION},
    "limit": {"limit": 2, "on_contention": _SOAK_CONTENTION},
    "rate": {"rate": "10/s"},
    "cancel": {"on_duplicate": "cancel", "on_contention": wait(timeout=60)},
}  # fmt: skip
SOAK_LIMIT, SOAK_RATE = 2, 10


def _soak(self: Any, item: str, seconds: float = 0.0) -> str:
    """Hold the key for ``seconds``, recording the run (and a rate's slot)."""
    started = begin(self, item)
    time.sleep(seconds)
    record(self, item, started, slot=getattr(self.request, "singleton_rate_slot", None))
    return item


@app.task(bind=True, acks_late=True, reject_on_worker_lost=True, name=task_name("soak_plain"))
def soak_plain(self: Any, item: str, seconds: float = 0.0) -> str:
    """The soak's control: plain Celery, no lock, under the same kills."""
    begin(self, item)
    time.sleep(seconds)
    return item


# acks_late with reject_on_worker_lost: a run killed with its pool child (or its whole
# worker) comes back, so every accepted call runs at least once through the kills.
soak_tasks = {
    mode: singleton_task(
        app=app, bind=True, key=["item"], name=task_name(f"soak_{mode}"),
        acks_late=True, reject_on_worker_lost=True, **options,
    )(_soak)
    for mode, options in SOAK_MODES.items()
}  # fmt: skip
