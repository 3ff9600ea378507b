"""A call waiting for its turn of a ``total_limit``: its message as kept in the waiting room,
sent again when its turn comes, and the sweep on the worker's timer that hands out the
slots no run's end handed out (a dead run's, a reservation whose message was lost).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from celery.utils.time import maybe_iso8601
from kombu.utils.json import dumps, loads

from .. import signals as singleton_signals
from ..config.options import is_singleton
from ..config.stores import LockStores
from ..lease.limits.backlog import backlog_of
from ..lease.limits.turns import Handed, Waiter, turns_of
from ..tokens import BYPASS_OPTION, NAME_HEADER, TURN_HEADER

if TYPE_CHECKING:
    from celery import Celery, Task

logger = logging.getLogger(__name__)


def kept_call(signature: Mapping[str, object], options: Mapping[str, object]) -> bytes | None:
    """A call as its waiting room keeps it: its signature (task, arguments, task id,
    links, chain, headers, queue: what a requeue sends again) and the options it is sent
    with. None: something in it is not JSON (it then waits as first come, first served)."""
    try:
        encoded: str = dumps({"s": dict(signature), "o": dict(options)})
    except (TypeError, ValueError) as error:
        logger.debug("a call's message not kept for its turn (%s)", error)
        return None
    return encoded.encode()


def send_turns(
    app: Celery, handed: list[Handed], forget: Callable[[str], list[Handed]] | None = None
) -> None:
    """Send each call whose turn came, as it was kept: its start claims the turn reserved
    for it. One not sent keeps its reservation until it runs out, and is then handed
    out again (``lease.limits.turns.RESERVE``): none is lost. One whose ``expires`` has
    passed is sent all the same (Celery ends it REVOKED, as any expired message) and its
    turn ``forget`` gives on at once: it will never claim it."""
    waiting = list(handed)
    while waiting:
        call = waiting.pop(0)
        if call.given_up:
            _given_up(app, call)
            continue
        try:
            kept = loads(call.record)
            # Its stamp, as the library's own header: the one message of the call that
            # may start (``lease.limits.turns``).
            own = kept["o"].get(BYPASS_OPTION)
            own = {**(own if isinstance(own, dict) else {}), TURN_HEADER: str(call.stamp)}
            app.signature(kept["s"]).apply_async(**{**kept["o"], BYPASS_OPTION: own})
        except Exception:
            logger.exception("celery-singleton-lock: call %s not sent on its turn", call.ident)
            continue
        logger.debug("call sent on its turn: %s", call.ident)
        if forget is not None and _expired(kept["s"]):
            waiting += forget(call.ident)


def _given_up(app: Celery, call: Handed) -> None:
    """A call sent on its turn again and again that never started (its message not sent,
    or dropped where it came: a worker without its task): said, as a skipped call."""
    try:
        signature = loads(call.record)["s"]
        name, headers = str(signature["task"]), signature.get("options", {}).get("headers")
    except (ValueError, KeyError, TypeError):
        name, headers = "?", None
    lock = (headers or {}).get(NAME_HEADER, name) if isinstance(headers, dict) else name
    logger.error(
        "celery-singleton-lock: %s[%s] given up: sent on its turn of %s again and again, "
        "it never started (is the task registered on the workers of its queue?)",
        name,
        Waiter.task_id_of(call.ident),
        lock,
    )
    task = app.tasks.get(name)
    if task is not None:
        task_id = Waiter.task_id_of(call.ident)
        singleton_signals.send(
            singleton_signals.execution_skipped, task, str(lock), task_id=task_id, holder_id=None
        )


def _expired(signature: Mapping[str, Any]) -> bool:
    """Whether a kept call's ``expires`` has passed (Celery will not run it)."""
    expires = (signature.get("options") or {}).get("expires")
    if expires is None:
        return False
    try:
        when = maybe_iso8601(expires) if isinstance(expires, str) else expires
    except ValueError:
        return False
    if not isinstance(when, datetime):
        return False
    return when <= (datetime.now(UTC) if when.tzinfo else datetime.now())


class TurnSweep:
    """Every ``INTERVAL`` s on a worker's timer: each of the app's tasks taking its total's
    turns round robin hands out the slots nothing handed out, and sends whose turn came:
    a slot freed by a dead run's worker or by its ttl, a reservation whose message was
    lost (put back in line once it runs out). A run's end hands its own slot out at once.
    With ``max_pending``, the places of the calls kept waiting are renewed (``PLACES``)."""

    INTERVAL = 0.5
    # A kept call's place (max_pending) lasts the queue ttl from when it was kept or last
    # renewed: renewed every this share of it while the call waits, so it never runs out.
    PLACES = 0.25

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._renew_at: dict[str, float] = {}
        self._said: set[str] = set()
        # The app's singleton tasks, found again when the registry grows, and how many
        # of them take turns: a worker with none of those asks the store nothing.
        self._tasks: list[Task] = []
        self._taking_turns = 0
        self._registered = -1

    @classmethod
    def of(cls, app: Celery) -> TurnSweep | None:
        """A worker's sweep; None where there is no waiting room (a store in memory, a
        Redlock, a Cluster: there the total is first come, first served)."""
        return cls(app) if turns_of(LockStores.for_app(app).lock) is not None else None

    def __call__(self) -> None:
        store = LockStores.for_app(self.app).lock
        turns = turns_of(store)
        if turns is None:
            return
        if not self._find_tasks():
            return  # no task of this worker takes turns: its sweep has nothing to do
        # A store out of reach raises: the worker's timer pauses the sweep (worker.timers).
        rooms = turns.with_calls()
        if not rooms:
            return
        served: set[str] = set()
        for task in self._tasks:
            mode = task.singleton_options().mode
            served.add(mode.waiting_room or "")
            if mode.takes_turns:
                forget = partial(mode.forget_turn, store)
                send_turns(self.app, mode.hand_out(store, rooms), forget)
                self._renew_places(task)
        self._say_unserved(set(rooms) - served)

    def _find_tasks(self) -> int:
        """How many of the app's tasks take turns (the registry read again only when it
        grew: tasks registered after the worker started are swept too)."""
        registry = self.app.tasks
        if len(registry) != self._registered:
            self._registered = len(registry)
            self._tasks = [task for task in list(registry.values()) if is_singleton(task)]
            self._taking_turns = sum(
                task.singleton_options().mode.takes_turns for task in self._tasks
            )
        return self._taking_turns

    def _say_unserved(self, rooms: set[str]) -> None:
        """Rooms with calls this worker has no task for: said once (a worker of another
        app or queue hands them out; if none does, their calls wait)."""
        for room in sorted(rooms - self._said):
            logger.warning(
                "celery-singleton-lock: calls wait for their turn of %s, whose task this "
                "worker does not have: a worker that has it hands their turns out",
                room,
            )
            self._said.add(room)

    def _renew_places(self, task: Task) -> None:
        """The places (``max_pending``) of ``task``'s calls kept waiting for their turn,
        renewed for its queue ttl: a wait longer than that keeps the cap."""
        context = task.singleton_context
        if context.options.max_pending is None:
            return
        now, ttl = time.monotonic(), context.queue_ttl
        if now < self._renew_at.get(task.name, 0.0):
            return
        self._renew_at[task.name] = now + ttl * self.PLACES
        kept = context.options.mode.kept_calls(context.store)
        places = [(name, Waiter.task_id_of(ident)) for ident, name in kept.items()]
        backlog_of(context.store).renew_all(places, ttl)


__all__ = ["TurnSweep", "kept_call", "send_turns"]
