"""Whether a lock's holder is still alive, and whether its run has started.

Workers are asked (a ping, then the tasks they list); queued messages are looked for in the
broker without consuming them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from kombu.exceptions import OperationalError

from ..broker import layout
from .locks import LockRow

if TYPE_CHECKING:
    from celery import Celery
    from kombu.connection import Connection
    from kombu.transport.redis import Channel as RedisChannel


# What ``inspect active`` lists: the runs in progress.
ACTIVE = "active"


@dataclass
class Verdict:
    alive: bool | None  # None: cannot be told
    why: str


@dataclass
class Liveness:
    """Worker pings and task lists, and queued messages looked for in the broker without
    consuming them, for the rows of one listing.

    - A reservation or running lease names its worker: alive while that worker answers a
      ping and still lists the task as active, reserved or scheduled.
    - A queued hold names only its task id. Messages move queue -> the broker's unacked set
      -> a worker, so they are looked for in that order (a message moving meanwhile is
      seen at its next stop), and releases are owner-checked: a hold that changed hands
      since (a worker reserved it) is never released.
    - On a Redis broker every queue's lists (all priority levels) and the unacked hash are
      read in batches (``broker.layout``: kombu's keys, its ``global_keyprefix`` included).
      An AMQP broker (RabbitMQ) cannot be searched without consuming: a queued hold counts
      as gone only when every queue is empty and no worker has the task.
    """

    app: Celery
    queues: Iterable[str] = ()
    timeout: float = 1.0
    _alive: set[str] | None = None
    _tasks: dict[str, set[str]] = field(default_factory=dict)
    # Where a worker has each task: active (started), reserved or scheduled (not yet).
    _where: dict[str, str] = field(default_factory=dict)
    # The pool child running each active task (Celery's worker_pid).
    _pids: dict[str, int] = field(default_factory=dict)
    _in_broker: dict[str, str] = field(default_factory=dict)
    _searched: set[str] = field(default_factory=set)
    _broker_note: str | None = None

    def prepare(self, rows: Iterable[LockRow]) -> None:
        """Look for the queued holds' messages first, then ask the workers (the class says why)."""
        queued = {r.task_id for r in rows if r.state == "queued" and r.task_id}
        if queued:
            self._search_broker(queued)  # asks the workers their queues first
        self._tasks.clear()
        self._ask_workers()  # after the broker: a message moving on is seen at its next stop

    def verdict(self, row: LockRow) -> Verdict:  # noqa: PLR0911  (a reason per finding)
        if row.state == "throttled":
            return Verdict(None, "a throttle window: nothing runs under it, it ends by itself")
        if row.state == "held" or row.task_id is None:
            return Verdict(None, "not a holder this library wrote")
        alive, tasks = self._workers()
        if row.worker is not None and row.state != "queued":
            if row.worker not in alive:
                return Verdict(False, f"worker {row.worker} does not answer a ping")
            if row.task_id in tasks.get(row.worker, set()):
                found = self._where.get(row.task_id, "active, reserved or scheduled")
                return Verdict(True, f"{row.worker} has the task {found}")
            return Verdict(False, f"{row.worker} answers but no longer has the task")
        if row.task_id not in self._searched:
            self._search_broker({row.task_id})
        where = self._in_broker.get(row.task_id)
        if where is not None:
            return Verdict(True, where)
        holders = [w for w, ids in tasks.items() if row.task_id in ids]
        if holders:
            return Verdict(True, f"{holders[0]} has the task")
        if self._broker_note is not None:
            return Verdict(None, self._broker_note)
        return Verdict(False, "its message is in no queue and no worker has it")

    def as_seen(self, row: LockRow) -> LockRow:
        """``row`` as its worker tells it (asked once, at the first running row): a
        running lease whose run the worker has not started (taken as the message
        arrived; the task is reserved or scheduled there) shows as ``reserved``, and a
        run in progress names its pool child's pid. Unchanged when the worker does not
        answer or no longer has the task (``orphans`` says which)."""
        if row.state != "running" or row.worker is None or row.task_id is None:
            return row
        try:
            alive, tasks = self._workers()
        except (OSError, OperationalError):  # no broker to ask through: the store's word
            self._alive = set()
            return row
        if row.worker not in alive or row.task_id not in tasks.get(row.worker, set()):
            return row
        if self._where.get(row.task_id) == ACTIVE:
            return replace(row, pid=self._pids.get(row.task_id, row.pid))
        return replace(row, state="reserved")

    # -- workers -----------------------------------------------------------------------

    def _workers(self) -> tuple[set[str], dict[str, set[str]]]:
        if self._alive is None:
            self._ask_workers()
        return self._alive or set(), self._tasks

    def _ask_workers(self) -> None:
        control = self.app.control
        replies = control.ping(timeout=self.timeout) or []
        self._alive = {name for reply in replies for name in reply}
        self._tasks = {}
        self._where = {}
        self._pids = {}
        if not self._alive:
            return
        # Every worker asked answered the ping: the replies end as soon as all are in.
        inspect = control.inspect(
            destination=sorted(self._alive), timeout=self.timeout, limit=len(self._alive)
        )
        listings = {
            ACTIVE: inspect.active(),
            "reserved (not started)": inspect.reserved(),
            "scheduled (waiting for its ETA)": inspect.scheduled(),
        }
        for where, listing in listings.items():
            for worker, entries in (listing or {}).items():
                ids = self._tasks.setdefault(worker, set())
                for entry in entries or ():
                    request = entry.get("request", entry)  # scheduled wraps its request
                    if request.get("id"):
                        ids.add(request["id"])
                        self._where.setdefault(request["id"], where)
                    if where == ACTIVE and isinstance(request.get("worker_pid"), int):
                        self._pids[request["id"]] = request["worker_pid"]

    def worker_queues(self) -> set[str]:
        """The queues the live workers consume from (``inspect active_queues``)."""
        alive, _ = self._workers()
        if not alive:
            return set()
        inspect = self.app.control.inspect(destination=sorted(alive), timeout=self.timeout)
        listing = inspect.active_queues() or {}
        return {q["name"] for queues in listing.values() for q in queues or () if q.get("name")}

    # -- broker ------------------------------------------------------------------------

    def _search_broker(self, wanted: set[str]) -> None:
        self._searched |= wanted
        names = set(self.queues) | set(self.app.amqp.queues.keys()) | self.worker_queues()
        with self.app.connection_for_read() as conn:
            conn.ensure_connection(max_retries=1)
            channel = conn.default_channel
            if conn.transport.driver_type == "redis":
                self._search_redis(channel, sorted(names), wanted)
            else:
                self._count_amqp(conn, sorted(names))

    def _search_redis(self, channel: RedisChannel, names: list[str], wanted: set[str]) -> None:
        client = layout.plain_client(channel)
        for queue in sorted(set(names) | layout.bound_queues(client, channel)):
            for task_id in layout.queued(client, channel, queue):
                self._found(task_id, wanted, f"its message is queued in {queue}")
        for task_id in layout.unacked(client, channel):
            self._found(
                task_id,
                wanted,
                "delivered to a worker and not acked: the broker restores it after "
                "visibility_timeout",
            )

    def _found(self, task_id: str | None, wanted: set[str], where: str) -> None:
        if task_id in wanted and task_id not in self._in_broker:
            self._in_broker[task_id] = where

    def _count_amqp(self, conn: Connection, names: list[str]) -> None:
        waiting = 0
        for queue in names:
            # kombu leaves Connection.channel untyped.
            channel = conn.channel()  # type: ignore[no-untyped-call]
            try:
                _, count, _ = channel.queue_declare(queue=queue, passive=True)
                waiting += count
            except conn.channel_errors:
                pass  # no such queue
            finally:
                channel.close()
        if waiting:
            self._broker_note = (
                f"{waiting} message(s) wait in {', '.join(names)} and an AMQP broker cannot be "
                "searched without consuming: cannot tell"
            )
