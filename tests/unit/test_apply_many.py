"""``apply_many`` with nothing but memory: the ``memory://`` lock store (the same Lua, run by
fakeredis) and kombu's in-memory broker; eagerly, as ``apply_async`` per item."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.signals import after_task_publish
from kombu.exceptions import EncodeError

from celery_singleton_lock import (
    Contended,
    DuplicateTaskError,
    Lease,
    MemoryLock,
    signals,
    singleton_task,
)
from celery_singleton_lock.config.stores import LockStores
from celery_singleton_lock.lease.batch_holds import HoldSpec, batch_holds_of
from celery_singleton_lock.tokens import holder_task_id


def job(x: object, y: int = 0) -> object:
    return x


@pytest.fixture(name="app")
def app_fixture() -> Celery:
    app = Celery("many", set_as_current=False)
    app.conf.update(broker_url="memory://", singleton_lock_url="memory://")
    return app


@pytest.fixture(name="sent")
def sent_fixture() -> Iterator[list[str]]:
    """The task ids of the messages published meanwhile."""
    ids: list[str] = []

    def heard(headers: dict[str, Any] | None = None, **_: Any) -> None:
        ids.append(str((headers or {}).get("id")))

    after_task_publish.connect(heard, weak=False)
    yield ids
    after_task_publish.disconnect(heard)


def holder_of(app: Celery, task: Any, *args: object) -> str | None:
    name = task.singleton_options().key.derive(args, {})
    return holder_task_id(LockStores.for_app(app).lock.holder(name))


class TestTheScript:
    def test_each_name_is_held_or_its_holder_named_in_one_call(self) -> None:
        store = MemoryLock()
        store.try_acquire("b", 30, token="tok-held")
        holds = batch_holds_of(store)
        assert holds is not None
        answers = holds.hold(
            [HoldSpec("a", 30, "tok-a"), HoldSpec("b", 30, "tok-b"), HoldSpec("c", 5, "tok-c")]
        )
        assert [type(answer) for answer in answers] == [Lease, Contended, Lease]
        held, refused = answers[0], answers[1]
        assert isinstance(held, Lease)
        assert isinstance(refused, Contended)
        assert held.token == "tok-a"
        assert held.fence == 0  # a dispatch's hold is unfenced
        assert refused.holder == "tok-held"
        assert store.holder("c") == "tok-c"

    def test_a_retried_batch_gets_the_same_answers(self) -> None:
        holds = batch_holds_of(MemoryLock())
        assert holds is not None
        batch = [HoldSpec("a", 30, "tok-a"), HoldSpec("b", 30, "tok-b")]
        assert all(isinstance(one, Lease) for one in holds.hold(batch))
        assert all(isinstance(one, Lease) for one in holds.hold(batch))

    def test_an_empty_batch_asks_nothing(self) -> None:
        holds = batch_holds_of(MemoryLock())
        assert holds is not None
        assert holds.hold([]) == []


class TestABatch:
    def test_results_in_order_one_message_per_key(self, app: Celery, sent: list[str]) -> None:
        task = singleton_task(app=app, name="many.job", shared=False)(job)
        results = task.apply_many([(f"k{i % 3}",) for i in range(9)])
        firsts = [result.id for result in results[:3]]
        assert len(set(firsts)) == 3
        assert [result.id for result in results] == firsts * 3
        assert sorted(sent) == sorted(firsts)
        assert [holder_of(app, task, f"k{i}") for i in range(3)] == firsts

    def test_a_held_key_answers_with_its_holder(self, app: Celery, sent: list[str]) -> None:
        task = singleton_task(app=app, name="many.job", shared=False)(job)
        held = task.delay("h")
        sent.clear()
        results = task.apply_many([("h",), ("new",), ("h",)])
        assert results[0].id == held.id == results[2].id
        assert sent == [results[1].id]

    def test_a_raising_task_gets_its_holder_too(self, app: Celery, sent: list[str]) -> None:
        options = {"on_duplicate": "raise"}
        task = singleton_task(app=app, name="many.job", shared=False, **options)(job)
        held = task.delay("r")
        assert [result.id for result in task.apply_many([("r",)])] == [held.id]
        with pytest.raises(DuplicateTaskError):
            task.delay("r")

    def test_signatures_bring_their_kwargs_and_options(self, app: Celery) -> None:
        task = singleton_task(app=app, name="many.job", shared=False, key=["x", "y"])(job)
        chosen = "7d1f5c8e-0000-4000-8000-000000000001"
        one, two = task.apply_many([task.s("s", y=1).set(task_id=chosen), task.s("s", y=2)])
        assert one.id == chosen
        assert two.id != chosen  # another key: y is part of it
        assert holder_of(app, task, "s", 1) == chosen
        assert holder_of(app, task, "s", 2) == two.id

    def test_a_signature_of_another_task_is_refused_before_anything_is_held(
        self, app: Celery, sent: list[str]
    ) -> None:
        task = singleton_task(app=app, name="many.job", shared=False)(job)
        other = singleton_task(app=app, name="many.other", shared=False)(job)
        with pytest.raises(TypeError, match=r"not a call of many\.job"):
            task.apply_many([("a",), other.s("b")])
        with pytest.raises(TypeError, match="tuple of positional arguments"):
            task.apply_many(["a"])
        assert sent == []
        assert holder_of(app, task, "a") is None

    def test_a_mode_that_replaces_sends_each_call_alone(self, app: Celery, sent: list[str]) -> None:
        options = {"on_duplicate": "replace", "key": ["x"]}
        task = singleton_task(app=app, name="many.job", shared=False, **options)(job)
        first, second = task.apply_many([("p", 1), ("p", 2)])
        assert second.id == first.id  # the second replaced the queued call's arguments
        assert len(sent) == 2  # each replacement is a message of its own

    def test_a_canvas_item_is_sent_alone_after_the_batch(
        self, app: Celery, sent: list[str]
    ) -> None:
        task = singleton_task(app=app, name="many.job", shared=False)(job)
        linked = task.s("c").set(link=task.si("after"))
        plain, canvas = task.apply_many([("c",), linked])
        assert canvas.id != plain.id  # a canvas member is never refused at dispatch
        assert sent == [plain.id, canvas.id]


class TestTheAnswers:
    def test_every_duplicate_is_signalled_with_its_id_and_its_holder(self, app: Celery) -> None:
        task = singleton_task(app=app, name="many.job", shared=False)(job)
        held = task.delay("s")
        heard: list[tuple[str, str, str]] = []

        def refused(sender: Any = None, name: str = "", **sent: Any) -> None:
            heard.append((name, sent["task_id"], sent["holder_id"]))

        items = [task.s(x).set(task_id=f"{x}-{n}") for n, x in enumerate("stts")]
        signals.duplicate_refused.connect(refused, weak=False)
        try:
            results = task.apply_many(items)
        finally:
            signals.duplicate_refused.disconnect(refused)
        name_s = task.singleton_options().key.derive(("s",), {})
        name_t = task.singleton_options().key.derive(("t",), {})
        assert results[1].id == "t-1"
        assert sorted(heard) == sorted(
            [(name_s, "s-0", held.id), (name_t, "t-2", "t-1"), (name_s, "s-3", held.id)]
        )

    def test_a_key_held_by_a_value_not_ours_refuses_the_whole_batch(
        self, app: Celery, sent: list[str]
    ) -> None:
        task = singleton_task(app=app, name="many.job", shared=False)(job)
        store = LockStores.for_app(app).lock
        name = task.singleton_options().key.derive(("x",), {})
        store.client.set(store.keys(name).lock, "not-a-token-of-ours")
        heard: list[tuple[str, object, object]] = []

        def refused(sender: Any = None, name: str = "", **sent: Any) -> None:
            heard.append((name, sent["task_id"], sent["holder_id"]))

        signals.duplicate_refused.connect(refused, weak=False)
        try:
            with pytest.raises(DuplicateTaskError, match="holder unknown"):
                task.apply_many([("a",), task.s("x").set(task_id="x-1")])
        finally:
            signals.duplicate_refused.disconnect(refused)
        assert heard == [(name, "x-1", None)]  # told, as a single call's refusal is
        assert sent == []
        assert holder_of(app, task, "a") is None  # its hold given back


class TestAFailure:
    def test_the_holds_of_the_messages_not_sent_are_given_back(
        self, app: Celery, sent: list[str]
    ) -> None:
        """kombu's in-memory transport publishes one message after the other: those sent
        before the failure keep their holds, the others give theirs back."""
        task = singleton_task(app=app, name="many.job", shared=False, key=["x"])(job)
        with pytest.raises(EncodeError):
            task.apply_many([("a",), ("b",), ("c", object()), ("d",)])
        assert [holder_of(app, task, x) for x in "ab"] == sent
        assert [holder_of(app, task, x) for x in "cd"] == [None, None]


class TestEager:
    def test_each_item_runs_as_apply_async_would(self) -> None:
        app = Celery("many-eager", set_as_current=False)
        app.conf.update(task_always_eager=True, singleton_lock_url="memory://")
        ran: list[object] = []

        def counted(x: object) -> object:
            ran.append(x)
            return x

        task = singleton_task(app=app, name="many.counted", shared=False)(counted)
        results = task.apply_many([("e",), ("e",), ("f",)])
        assert [result.get() for result in results] == ["e", "e", "f"]
        assert ran == ["e", "e", "f"]  # eagerly each call runs, and frees its key after
        assert len({result.id for result in results}) == 3
