"""Celery settings, lowercase as Celery names them (under Django, the same names with a
``CELERY_`` prefix in settings.py and ``config_from_object(..., namespace="CELERY")``).

Everything comes from the environment so the demo can point the project at its own
Redis and database; in your project these would be plain values.
"""

import os

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

broker_url = REDIS_URL
result_backend = REDIS_URL
worker_prefetch_multiplier = 1
broker_connection_retry_on_startup = True

# celery-singleton-lock: the locks live in the result backend's Redis unless
# CELERY_SINGLETON_LOCK_URL says otherwise.
singleton_lock_prefix = "example"
# Short, so a killed worker's locks free quickly in the demo; renewed while tasks run.
singleton_lock_ttl = float(os.environ.get("DEMO_LOCK_TTL", "3"))

# Where the managers record their effects: outside the lock store, as a real service
# would (its own database).
EFFECTS_DB = os.environ.get("DEMO_DB", "example_effects.sqlite3")

# How long processing one request takes (the slow, side-effecting part).
WORK_SECONDS = float(os.environ.get("DEMO_WORK_SECONDS", "0.05"))

# The demo's --without-lock run sets this to "0" to show what the locks prevent.
LOCKS_ENABLED = os.environ.get("DEMO_LOCKS", "1") == "1"
