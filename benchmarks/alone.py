"""Each system dispatching in a process of its own, as its users run it: the dispatch
sections' child (``python -m benchmarks.alone SYSTEM``) and the bench's handle on it.

A user's producer imports one of these libraries, with one app; the child imports only
the system it measures, builds its one app and task from ``settings`` and runs the calls
the bench sends it, one line of JSON each, answering each with the seconds they took on
its own clock (the pipe's time left out). ``plain_alone`` is the control: plain Celery,
one app, one task, nothing else imported. ``plain`` is plain Celery's task in the app the
other sections run (``bench_app``), every system imported and registered beside it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# A task's ``apply_async``: ``send((item,), queue=...)``.
Send = Callable[..., Any]


def _settings() -> Any:
    # Imported as a child builds its system: run.py imports this module before it sets
    # the environment ``settings`` reads, and a module read then would keep those values
    # for bench_app too.
    from benchmarks import settings  # noqa: PLC0415

    return settings


def _app(name: str, **options: Any) -> Any:
    from celery import Celery  # noqa: PLC0415  (each builder imports what it measures)

    settings = _settings()
    app = Celery(name, broker=settings.BROKER, backend=settings.RESULTS)
    app.conf.update(settings.CELERY, **options)
    return app


def _item(item: str, seconds: float = 0.0) -> str:
    """The task's body, ``bench_app``'s signature (no worker consumes these messages)."""
    return item


def plain_alone() -> Send:
    send: Send = _app("bench-plain").task(shared=False, name="bench.plain")(_item).apply_async
    return send


def plain_with_every_system() -> Send:
    import benchmarks.bench_app as bench  # noqa: PLC0415  (every system, as sections 3-9)

    send: Send = bench.plain.apply_async
    return send


def celery_singleton() -> Send:
    from celery_singleton import Singleton  # noqa: PLC0415  (this system alone)

    app = _app("bench-celery-singleton", **_settings().CELERY_SINGLETON)
    send: Send = app.task(shared=False, name="bench.celery_singleton", base=Singleton)(
        _item
    ).apply_async
    return send


def celery_once() -> Send:
    from celery_once import QueueOnce  # noqa: PLC0415  (this system alone)

    app = _app("bench-celery-once", **_settings().CELERY_ONCE)
    options = {"base": QueueOnce, "once": {"graceful": True}}
    send: Send = app.task(shared=False, name="bench.celery_once", **options)(_item).apply_async
    return send


def this() -> Send:
    from celery_singleton_lock import singleton_task  # noqa: PLC0415  (this system alone)

    send: Send = singleton_task(
        app=_app("bench", **_settings().THIS), shared=False, name="bench.this"
    )(_item).apply_async
    return send


def this_events_on() -> Send:
    """``this`` in a producer that sends task-sent events (``task_send_sent_event``): a
    refused call also sends its ``singleton-refused`` event."""
    from celery_singleton_lock import singleton_task  # noqa: PLC0415  (this system alone)

    app = _app("bench-events", task_send_sent_event=True, **_settings().THIS)
    send: Send = singleton_task(app=app, shared=False, name="bench.this_events")(_item).apply_async
    return send


def this_no_receivers() -> Send:
    """``this`` with the events' receivers disconnected: against ``this`` (events off, its
    receivers connected as in every producer), what events off costs a refused call."""
    from celery_singleton_lock.contrib import events  # noqa: PLC0415  (this system alone)

    send = this()
    events.uninstall()
    return send


def this_idempotent() -> Send:
    """``this`` called with an idempotency key per item (``bench_app.Idempotent``)."""
    send = this()

    def idempotent(args: tuple[str, ...], **options: Any) -> Any:
        return send(args, idempotency_key=f"idem-{args[0]}", **options)

    return idempotent


class _Refused(BaseException):
    """A duplicate refused inside the push (a BaseException: Celery's publish retries
    an Exception)."""


# The least a hold can add: check the key, push, hold it, one script (no transit note,
# history, fencing or outage policy); the key is a digest of the arguments.
_FLOOR_SCRIPT = (
    "if redis.call('GET', KEYS[1]) then return 0 end "
    "redis.call('LPUSH', KEYS[2], ARGV[1]) "
    "redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1"
)


def hold_floor() -> Send:
    """The floor any lock on Celery's own publish path pays: plain Celery's task with the
    least a hold can add, as a control row. Where the locks are on the broker's Redis the
    hold rides the push (its key in the queue's database) (kombu's ``_put`` patched in this process only, as a lock library's
    transport would); elsewhere it is a ``SET NX PX`` on the lock server before the publish.
    A duplicate publishes nothing."""
    import contextvars  # noqa: PLC0415
    import hashlib  # noqa: PLC0415

    import redis  # noqa: PLC0415
    from kombu.transport import redis as kombu_redis  # noqa: PLC0415
    from kombu.utils.json import dumps  # noqa: PLC0415

    settings = _settings()
    send = plain_alone()
    holding: contextvars.ContextVar[str | None] = contextvars.ContextVar("hold", default=None)
    ttl_ms = 30_000

    def key_of(args: tuple[str, ...]) -> str:
        digest = hashlib.sha256(json.dumps([list(args), {}]).encode()).hexdigest()
        return f"floor:bench.plain:{digest}"

    def server(url: str) -> str:
        return url.rsplit("/", 1)[0]  # scheme, host and port: the database aside

    if server(settings.LOCKS) != server(settings.BROKER):
        locks = redis.Redis.from_url(settings.LOCKS)

        def held_apart(args: tuple[str, ...], **options: Any) -> Any:
            if not locks.set(key_of(args), "q|floor", nx=True, px=ttl_ms):
                return None
            return send(args, **options)

        return held_apart

    original = kombu_redis.Channel._put
    sha: list[str] = []

    def _put(channel: Any, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        key = holding.get()
        if key is None:
            original(channel, queue, message, **kwargs)
            return
        priority = channel._get_message_priority(message, reverse=False)
        with channel.conn_or_acquire() as client:
            if not sha:
                sha.append(client.script_load(_FLOOR_SCRIPT))
            list_key = channel._q_for_pri(queue, priority)
            payload = dumps(message)
            if not client.evalsha(sha[0], 2, key, list_key, payload, "q|floor", ttl_ms):
                raise _Refused

    # In this child process only: the floor's hold rides the push as a lock's transport would.
    setattr(kombu_redis.Channel, "_put", _put)  # noqa: B010

    def held_riding(args: tuple[str, ...], **options: Any) -> Any:
        token = holding.set(key_of(args))
        try:
            return send(args, **options)
        except _Refused:
            return None
        finally:
            holding.reset(token)

    return held_riding


BUILDERS: dict[str, Callable[[], Send]] = {
    "plain_alone": plain_alone,
    "hold_floor": hold_floor,
    "plain": plain_with_every_system,
    "celery_singleton": celery_singleton,
    "celery_once": celery_once,
    "this": this,
    "this_idempotent": this_idempotent,
    "this_events_on": this_events_on,
    "this_no_receivers": this_no_receivers,
    # ``this`` again, in a process of its own: how far two processes running the same
    # code differ, against which this_no_receivers' difference is read.
    "this_again": this,
}


def main(system: str) -> int:
    """Build ``system``, say so, then run each order read from stdin: ``count`` calls to
    ``queue``, each with ``args`` (``same``) or ``args-<i>``, answered with their seconds."""
    send = BUILDERS[system]()
    # The answers on a descriptor of their own: whatever a library prints goes to stderr.
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    answers.write(json.dumps({"ready": system}) + "\n")
    # A batch where the system has one (this project's ``apply_many``); else call by call.
    many = getattr(getattr(send, "__self__", None), "apply_many", None)
    for line in sys.stdin:
        order = json.loads(line)
        queue, args, count, same = order["queue"], order["args"], order["count"], order["same"]
        keys = order.get("keys")
        began = time.perf_counter()
        if keys:
            items = [(f"{args}-{i % keys}",) for i in range(count)]
            if many is not None:
                many(items, queue=queue)
            else:
                for item in items:
                    send(item, queue=queue)
        else:
            for i in range(count):
                send((args if same else f"{args}-{i}",), queue=queue)
        answers.write(json.dumps({"seconds": time.perf_counter() - began}) + "\n")
    return 0


class Alone:
    """The bench's handle on one system's child process."""

    def __init__(self, system: str) -> None:
        self.system = system
        # The bench's environment (its servers' URLs, ``settings``) passes on as it is.
        self.process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.alone", system],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def _answer(self) -> dict[str, Any]:
        line = self.process.stdout.readline() if self.process.stdout else ""
        if not line:
            raise RuntimeError(f"{self.system}'s process ended (exit {self.process.wait()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ready(self) -> None:
        """Wait until the child has built its app and task."""
        self._answer()

    def calls(
        self, queue: str, args: str, count: int, *, same: bool = False, keys: int = 0
    ) -> float:
        """Seconds the child took for ``count`` calls to ``queue``: each with ``args``
        (``same``: a duplicate of the first) or with ``args-<i>`` (each unique); with
        ``keys``, over that many distinct arguments, as one batch where the system has
        one (``apply_many``), else call by call."""
        order = {"queue": queue, "args": args, "count": count, "same": same, "keys": keys}
        if self.process.stdin is None:
            raise RuntimeError(f"{self.system}'s process has no stdin")
        self.process.stdin.write(json.dumps(order) + "\n")
        self.process.stdin.flush()
        return float(self._answer()["seconds"])

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextmanager
def started(systems: Iterable[str]) -> Iterator[dict[str, Alone]]:
    """A process of its own for each of ``systems``, all built before the first call
    (they start together, then wait for their orders); ended on leaving."""
    children: dict[str, Alone] = {}
    try:
        for system in systems:
            children[system] = Alone(system)
        for child in children.values():
            child.ready()
        yield children
    finally:
        for child in children.values():
            child.close()


if __name__ == "__main__":
    [chosen] = sys.argv[1:]
    sys.exit(main(chosen))
