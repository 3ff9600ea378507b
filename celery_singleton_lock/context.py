"""The typed views of a singleton task its helpers get: ``TaskContext`` and ``Delivery``.

Helpers (the execution, a pending hold, the worker's reservations, the outage policy) read
what they need of a task through these objects instead of the task itself. Model:
tenacity's ``RetryCallState``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .config.options import SingletonOptions
from .config.stores import LockStores
from .config.visibility import longest_countdown, visibility_timeout
from .exceptions import ConfigurationError
from .lease import LockStore, split_role
from .lease.history import Record
from .lease.limits.overrides import Override, overrides_of

if TYPE_CHECKING:
    from celery import Celery


class TaskContext:
    """What one singleton task's helpers may read of it: the task's options, the app's lock
    stores and the lease times in force. Cheap to make: it caches nothing, so a test that
    swaps the app's settings (``LockStores.forget``) is seen at once."""

    __slots__ = ("_options", "app", "name")

    def __init__(self, app: Celery, name: str, options: Callable[[], SingletonOptions]) -> None:
        self.app = app
        self.name = name
        self._options = options

    @property
    def options(self) -> SingletonOptions:
        return self._options()

    @property
    def stores(self) -> LockStores:
        """The app's lock store(s) and settings."""
        return LockStores.for_app(self.app)

    @property
    def store(self) -> LockStore:
        """The lock store for operations of one round trip."""
        return self.stores.lock

    @property
    def waiting(self) -> LockStore:
        """The lock store for blocking waits (``on_contention=wait``)."""
        return self.stores.waiting

    @property
    def ttl(self) -> float:
        """The running lease's ttl: the task's own, else the app's."""
        return self.options.ttl or self.stores.config.ttl

    @property
    def queue_ttl(self) -> float:
        """How long a queued hold lasts: the task's own, else the app's."""
        return self.options.queue_ttl or self.stores.config.queue_ttl

    def one_hop(self, countdown: float) -> float:
        """As much of ``countdown`` as a message may wait unacked in the worker that has it
        before the broker hands it out again: below its ``visibility_timeout`` (RabbitMQ:
        its ``consumer_timeout``; ``config.visibility``); the rest is waited in further hops."""
        longest = longest_countdown(self.app.conf, self.stores.config.consumer_timeout)
        return countdown if longest is None else min(countdown, longest)

    @property
    def unacked_for(self) -> float | None:
        """How long the broker lets a message stay unacked before it hands it out again
        (``config.visibility``; None: it never does)."""
        return visibility_timeout(self.app.conf, self.stores.config.consumer_timeout)

    @property
    def keeps_history(self) -> bool:
        """Whether this task's locks keep a history: asked for (the task's option, else
        the app's) and a store that can (a single server's: ``lease.history``)."""
        wanted = self.options.history
        kept = getattr(self.store, "keeps_history", False)
        return bool(kept and (self.stores.config.history if wanted is None else wanted))

    def override(self, lock_name: str, *, fresh: bool = False) -> Override | None:
        """An operator's override of this call's limits (``celery singleton limits set``):
        the lock's own, else its key template's or this task's. Only a task with a rate
        or a limit has one; read at most every ``overrides.REFRESH`` seconds (``fresh``:
        now)."""
        options = self.options
        if not options.mode.overridable:
            return None
        try:
            overrides = overrides_of(self.store)
        except ConfigurationError:  # a Redlock: limits are the code's
            return None
        template = options.key.key
        families = (template, self.name) if isinstance(template, str) else (self.name,)
        return overrides.find(lock_name, families, fresh=fresh)

    def record(
        self,
        lock_name: str,
        task_id: str | None,
        *,
        refused: Mapping[str, Mapping[str, str]] | None = None,
        **events: tuple[str, str, str],
    ) -> Record | None:
        """What to write in the history of ``lock_name`` (a companion's: its lock's) around
        the operations of ``events``' kinds (``Record``); None when this task keeps none."""
        if not self.keeps_history:
            return None
        config = self.stores.config
        base, _ = split_role(lock_name)
        return Record(
            key=self.store.keys(base).history,
            events=events,  # type: ignore[arg-type]
            refused=refused or {},  # type: ignore[arg-type]
            fields={"task": self.name, "id": task_id or ""},
            length=config.history_length,
            ttl_ms=round(config.history_ttl * 1000),
        )


class Request(Protocol):
    """What the library reads of Celery's request context (``celery.app.task.Context``,
    which Celery does not type)."""

    id: str
    hostname: str | None
    is_eager: bool
    headers: Mapping[str, object] | None
    # Written too: a later call's arguments, for the run and what it sends again.
    args: Sequence[object] | None
    kwargs: Mapping[str, object] | None


@dataclass(frozen=True, slots=True)
class Delivery:
    """One delivery of a singleton task's message, as its execution sees it: its request,
    and what may be done with it (store a state under its id, send it again).

    The task makes one per run (``SingletonTask.__call__``); the execution reads the
    request through it and acts on the message only through its two callables.
    """

    context: TaskContext
    request: Request
    # The task, as the ``sender`` of the library's signals (receivers filter on it).
    sender: object
    # Whether a state stored under this id can be read back (ignore_result off).
    keeps_results: bool
    # LockStore ``meta`` in ``state`` under this delivery's task id.
    store_state: Callable[[object, str], None]
    # Send this message again (same id, links and chain) with these headers in
    # ``countdown`` seconds, and with these options (the library's own bypass).
    resend: Callable[[float, dict[str, object], dict[str, object]], None]
    # This message as a waiting room keeps it, to be sent again with these headers and
    # options on its turn (``broker.turn_sweep.kept_call``); None: it cannot be kept.
    keep: Callable[[dict[str, object], dict[str, object]], bytes | None] = lambda *_: None

    @property
    def name(self) -> str:
        return self.context.name
