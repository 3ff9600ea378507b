"""Where the bench's apps connect and how each system is configured, read from the
environment run.py sets; imports none of the systems, so a process can build one alone."""

from __future__ import annotations

import os
from typing import Any

BROKER = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/0")
RESULTS = os.environ.get("BENCH_RESULT_URL") or BROKER
# Empty: this project finds its lock store itself (the result backend's Redis).
LOCKS = os.environ.get("BENCH_LOCK_URL") or RESULTS
MARKS = os.environ.get("BENCH_MARKS_URL") or BROKER

# Every app's Celery settings, plain Celery's included.
CELERY: dict[str, Any] = {
    "task_ignore_result": os.environ.get("BENCH_RESULTS") != "1",
    "worker_prefetch_multiplier": 4,
    "broker_connection_retry_on_startup": True,
}

# celery-singleton 0.3.1: keys never expire by default; 60 s as the issue measured.
CELERY_SINGLETON: dict[str, Any] = {
    "singleton_backend_url": LOCKS,
    "singleton_key_prefix": "cs:",
    "singleton_lock_expiry": 60,
}

# celery-once 3.0.1
CELERY_ONCE: dict[str, Any] = {
    "ONCE": {
        "backend": "celery_once.backends.Redis",
        "settings": {"url": LOCKS, "default_timeout": 60},
    },
}

# This project: None finds the lock store itself (the result backend's Redis).
THIS: dict[str, Any] = {
    "singleton_lock_url": os.environ.get("BENCH_LOCK_URL") or None,
    "singleton_lock_prefix": "csl",
    "singleton_lock_ttl": float(os.environ.get("BENCH_TTL", "30")),
}
