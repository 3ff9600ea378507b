"""``TaskContext``: the typed view of a singleton task its helpers get (options, stores, ttls).

Helpers (the execution, a pending hold, the worker's reservations, the outage policy)
read what they need of a task through this object instead of the task's private
members: its options, the app's lock stores and the lease times in force.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .backend import Backend, Store
from .options import SingletonOptions


class TaskContext:
    """What one singleton task's helpers may read of it. Cheap to make: it caches nothing,
    so a test that swaps the app's settings (``Backend.forget``) is seen at once."""

    __slots__ = ("_options", "app", "name")

    def __init__(self, app: Any, name: str, options: Callable[[], SingletonOptions]) -> None:
        self.app = app
        self.name = name
        self._options = options

    @property
    def options(self) -> SingletonOptions:
        return self._options()

    @property
    def backend(self) -> Backend:
        """The app's lock store(s) and settings."""
        return Backend.for_app(self.app)

    @property
    def store(self) -> Store:
        """The lock store for one-round-trip operations."""
        return self.backend.lock

    @property
    def waiting(self) -> Store:
        """The lock store for blocking waits (``on_contention=wait``)."""
        return self.backend.waiting

    @property
    def ttl(self) -> float:
        """The running lease's ttl: the task's own, else the app's."""
        return self.options.ttl or self.backend.config.ttl

    @property
    def queue_ttl(self) -> float:
        """How long a queued hold lasts: the task's own, else the app's."""
        return self.options.queue_ttl or self.backend.config.queue_ttl
