"""One call of a singleton task at dispatch (``Dispatch``), built once in ``apply_async``.

Every step of a dispatch (the route, the hold, the gate, the push, a replacement) reads the
call's facts here, and the task's own (``TaskFacts``, computed once per task).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING

from celery.utils import uuid

from .. import outages
from .. import signals as singleton_signals
from ..broker.in_transit import InTransit
from ..broker.ride import LockRide, lock_ride
from ..config.stores import LockStores
from ..context import TaskContext
from ..exceptions import LockStoreUnavailableError
from ..lease import Contended
from ..tokens import (
    ANSWER_HEADER,
    CALL_HEADERS,
    HOLD_HEADER,
    NAME_HEADER,
    RATE_SLOT_HEADER,
    TOKEN_HEADER,
)
from .refusals import refusals
from .timing import delay_of, deliverable

if TYPE_CHECKING:
    from celery import Celery, Task
    from celery.result import AsyncResult

    from ..broker.pushes import Pushes
    from ..config.options import SingletonOptions
    from ..lease import LockStore
    from ..lease.history import Record
    from ..modes.base import Mode

# The library's headers a publish drops from the caller's (a copied request's headers must
# not claim a stale hold) unless the call sets them itself.
OWN_ONLY = (TOKEN_HEADER, HOLD_HEADER, RATE_SLOT_HEADER, ANSWER_HEADER, *CALL_HEADERS)


class TaskFacts(TaskContext):
    """A task's context read once, for its dispatches: its options and mode, the app's
    stores and lock store, the hold's and the lease's ttl, whether it keeps a history,
    the app's ride and the pushes its hold may ride. Made once per task, and again when
    the app's stores or the task's options are replaced (a test's ``LockStores.forget``,
    a patched option): ``SingletonTask`` asks ``current`` on every call."""

    # Each shadows ``TaskContext``'s property of that name: read once, here.
    __slots__ = (
        "keeps_history",
        "mode",
        "options",
        "queue_ttl",
        "ridden",
        "ride",
        "store",
        "stores",
        "ttl",
    )

    options: SingletonOptions
    stores: LockStores
    store: LockStore
    ttl: float
    queue_ttl: float
    keeps_history: bool

    def __init__(self, app: Celery, name: str, options: SingletonOptions) -> None:
        super().__init__(app, name, lambda: options)
        # Read once from a context that reads them as it is asked: TaskContext's rules.
        live = TaskContext(app, name, lambda: options)
        self.options = options
        self.stores = live.stores
        self.store = live.store
        self.ttl = live.ttl
        self.queue_ttl = live.queue_ttl
        self.keeps_history = live.keeps_history
        self.mode: Mode = options.mode
        self.ride: LockRide = lock_ride(app)
        self.ridden: Pushes | None = self.ride.pushes_for(self)

    @property
    def pushes(self) -> Pushes | None:
        """The pushes the task's hold may ride, while its server takes them: one that
        refused a push (an ACL) is given up, and each hold then goes alone."""
        ridden = self.ridden
        return ridden if ridden is not None and ridden.usable else None

    def current(self, options: SingletonOptions) -> bool:
        """Whether these are still the task's ``options`` and the app's stores."""
        return self.options is options and LockStores.for_app(self.app) is self.stores


class Dispatch:
    """One call of a task being dispatched: its arguments, options and task id as given,
    what Celery's ``apply_async`` is handed to publish it, and, once its route knows them,
    its lock name and the hold it takes (lock, ttl, token, headers).

    Built once per call by ``SingletonTask.apply_async``; the route, the held path, the
    gate and the ride's push (``broker.state.HeldCall``) read it instead of relaying its
    fields.
    """

    __slots__ = (
        "args",
        "bypass",
        "call",
        "canvas",
        "facts",
        "hold",
        "kwargs",
        "link",
        "link_error",
        "lock_name",
        "options",
        "own_headers",
        "producer",
        "record",
        "redrive",
        "rides",
        "send",
        "shadow",
        "task",
        "task_id",
        "token",
        "ttl",
    )

    def __init__(  # noqa: PLR0917  (Celery's apply_async arguments, taken once)
        self,
        task: Task,
        facts: TaskFacts,
        args: Sequence[object] | None,
        kwargs: Mapping[str, object] | None,
        options: dict[str, object],
        task_id: str | None,
        producer: object,
        link: object,
        link_error: object,
        shadow: str | None,
        send: Callable[..., AsyncResult],
        *,
        bypass: object,
        redrive: bool,
    ) -> None:
        self.task = task
        self.facts = facts
        self.args = args
        self.kwargs = kwargs
        # The call's arguments, as the task receives them.
        self.call: tuple[Sequence[object], Mapping[str, object]] = (args or (), kwargs or {})
        self.options = options
        self.task_id = task_id
        self.producer = producer
        self.link = link
        self.link_error = link_error
        self.shadow = shadow
        self.send = send  # Celery's own apply_async, bound to the task
        # A resend of ours (a dict of a held call's headers, or True), or dedupe=False.
        self.bypass = bypass
        self.redrive = redrive
        # Refusing a message that carries the rest of a chain, a group slot or a chord
        # header would silently drop that work (or leave a GroupResult waiting forever).
        # Such messages skip the queue-level hold; the execution level still keeps them
        # from running concurrently with a duplicate.
        self.canvas = bool(
            link
            or link_error
            or options.get("chain") is not None
            or options.get("group_id")
            or options.get("chord")
        )
        self.lock_name = ""
        self.record: Record | None = None
        # The hold a held call takes: ``plan_hold``.
        self.hold = ""
        self.ttl = 0.0
        self.token = ""
        self.own_headers: dict[str, object] = {}
        # Whether its hold may ride the push (the task's pushes, through a producer): the
        # ride says, as it publishes the call (``LockRide.publish_held``).
        self.rides = False

    @property
    def context(self) -> TaskContext:
        return self.facts

    @property
    def pushes(self) -> Pushes | None:
        return self.facts.pushes

    def new_task_id(self) -> str:
        """The call's task id, made now if the caller gave none."""
        if not self.task_id:
            self.task_id = uuid()
        return self.task_id

    def plan_hold(self, delay: float) -> None:
        """The hold this call takes before it is sent, as its mode plans it (for the queue
        ttl plus ``delay``, the call's own countdown)."""
        mode = self.facts.mode
        token = mode.token(self.new_task_id())
        planned = mode.hold(self.lock_name, token, self.facts.queue_ttl + delay)
        self.hold, self.ttl, self.token = planned.lock, planned.ttl, planned.token
        self.own_headers = planned.headers

    def through_producer(self) -> bool:
        """Whether Celery publishes this call through a producer of the app's: not run
        eagerly, and no ``connection=`` (Celery then uses its own producer)."""
        return not (
            self.facts.app.conf.task_always_eager or self.options.get("connection") is not None
        )

    def publish(
        self,
        task_id: str | None,
        options: dict[str, object],
        own_headers: dict[str, object],
        via: object = None,
    ) -> AsyncResult:
        """Publish the call (Celery's ``apply_async``) under ``task_id`` with ``options``
        and the library's ``own_headers``, through ``via`` (a producer) when given: what
        every step of the dispatch publishes with."""
        # Read, not popped: a publish again (fail_open, an outage) keeps them too.
        given = options.get("headers") or {}
        if not isinstance(given, Mapping):
            raise TypeError(f"{self.task.name}: headers= must be a dict, got {given!r}")
        headers = {**given, **own_headers}
        for name in OWN_ONLY:
            if name not in own_headers:
                headers.pop(name, None)
        task_id = task_id or uuid()  # as Celery would: the channel knows its message
        deliverable(self.task, self.call, options)
        facts = self.facts
        noted = InTransit.of(facts, task_id, own_headers, delay_of(options))
        # Celery's own apply_async, given the producer the note's publish picks.
        send = partial(
            self.send,
            self.args,
            self.kwargs,
            task_id=task_id,
            link=self.link,
            link_error=self.link_error,
            shadow=self.shadow,
            **dict(options, headers=headers),
        )
        return noted.publish(facts.app, via or self.producer, options, send)

    def publish_held(self, via: object = None) -> AsyncResult:
        """Publish the call with the hold it took (``plan_hold``)."""
        return self.publish(self.task_id, self.options, self.own_headers, via)

    def publish_unheld(self) -> AsyncResult:
        """Publish the call without a hold (an outage under fail_open)."""
        return self.publish(self.task_id, self.options, {NAME_HEADER: self.lock_name})

    def outage(self, error: LockStoreUnavailableError) -> None:
        """The task's ``singleton_lock_on_redis_error`` at dispatch: fail_closed raises."""
        outages.at_dispatch(self.facts, self.lock_name, error)

    def answered_early(self, hold: str) -> Contended | None:
        """A name refused a moment ago is likely refused again (a storm of duplicates): ask
        who holds ``hold`` with a read that writes nothing (but a refusal in the call's
        history), and answer a duplicate before Celery builds its message (its holder,
        returned). None: it is free (or unknown) now; dispatch as usual."""
        if not refusals.expects(self.lock_name):
            return None
        store = self.facts.store
        try:
            holder = store.holder(hold, entry=self.record)
        except LockStoreUnavailableError:
            return None  # the dispatch itself meets the outage and its policy
        if not holder:
            return None
        refusals.note(self.lock_name, None)
        return Contended(hold, store.keys(hold).lock, holder, None)

    def refused(self, held: Contended) -> None:
        """Refused by ``held``, nothing sent: the name's next call asks first, until
        ``held``'s holder is likely gone."""
        refusals.note(self.lock_name, held.retry_after)

    def accepted(self) -> None:
        """Sent with its hold: the name is free to this process's next call."""
        refusals.forget(self.lock_name)
        singleton_signals.send(
            singleton_signals.dispatch_accepted, self.task, self.lock_name, task_id=self.task_id
        )
