"""The worker's main process: requests, reservations, the child watch, setup checks, receivers.

What Celery's own ``celery/worker/`` does for every task, this package adds for
singleton tasks; nothing here runs in a pool child.
"""

from .request import SingletonRequest

__all__ = ["SingletonRequest"]
