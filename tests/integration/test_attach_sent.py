"""An attached call is sent again through its task's own ``apply_async`` (Celery's publish
signals and checks on the way, its id, canvas and queue as kept), answered or promoted; a
process that does not know its task publishes the kept message as it was (real workers
and a real broker)."""

from __future__ import annotations

import base64
import json
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery, chain
from celery.signals import after_task_publish
from celery.utils import uuid

from celery_singleton_lock.broker.attached import kept_message, send_kept
from celery_singleton_lock.broker.transit import Transit
from celery_singleton_lock.config.stores import LockStores
from celery_singleton_lock.lease.attachments import attachments_of
from celery_singleton_lock.tokens import (
    ANSWER_HEADER,
    NAME_HEADER,
    TOKEN_HEADER,
    holder_task_id,
    queued_token,
)

from ..conftest import CeleryEnv
from ..support.runs import UNTIL_OPENED, open_gate, runs, started, wait_for
from ..support.workers import Worker

PREFIX = "tp"  # locks (and attached calls) no other test's worker sweeps
QUEUE = "attach-sent"  # a queue no worker reads


def published(cenv: CeleryEnv, task_id: str) -> list[dict[str, Any]]:
    """What the worker's processes published under ``task_id`` through Celery's
    ``apply_async`` (its ``after_task_publish``, ``tasks.attach.published``)."""
    found = (json.loads(raw) for raw in cenv.checker_client().lrange("published", 0, -1))
    return [each for each in found if each["id"] == task_id]


def follows(cenv: CeleryEnv) -> list[list[Any]]:
    return [json.loads(f) for f in cenv.checker_client().lrange("follows", 0, -1)]


def attached(cenv: CeleryEnv, item: str) -> int:
    name = cenv.app_module.work.singleton_options().key.derive((item,), {})
    count: int = cenv.lock_client().hlen(f"{PREFIX}:{{{name}}}:attached")
    return count


def running(cenv: CeleryEnv, item: str) -> dict[str, Any]:
    found = wait_for(
        lambda: [s for s in started(cenv) if s["item"] == item], what=f"{item} running"
    )
    first: dict[str, Any] = found[0]
    return first


@pytest.fixture(name="publishing")
def fixture_publishing(cenv: CeleryEnv) -> Iterator[Worker]:
    """A worker that records what its processes publish through ``apply_async``, with
    its locks under a prefix of its own (the test's producer uses it too meanwhile)."""
    app = cenv.app_module.app
    worker = Worker(cenv.env, extra_env={"CSL_LOCK_PREFIX": PREFIX, "CSL_PUBLISHED": "1"})
    worker.start()
    app.conf.singleton_lock_prefix = PREFIX
    LockStores.forget(app)
    try:
        yield worker
    finally:
        app.conf.singleton_lock_prefix = "t"
        LockStores.forget(app)
        worker.stop()


class TestThroughApplyAsync:
    def test_an_answered_call_is_sent_through_apply_async(
        self, cenv: CeleryEnv, publishing: Worker
    ) -> None:
        """A chain's step and a call with a link, attached to a running holder: each is
        published by Celery's apply_async under its own id, to its queue, with the
        holder's id to answer from and no hold; the chain and the link go on once."""
        work, follow = cenv.app_module.work, cenv.app_module.follow
        q = publishing.queue
        holder = work.apply_async(("s1", UNTIL_OPENED), queue=q)
        running(cenv, "s1")
        linked = work.apply_async(("s1",), queue=q, link=follow.s("L").set(queue=q))
        after = chain(work.si("s1").set(queue=q), follow.s("C").set(queue=q)).apply_async()
        assert attached(cenv, "s1") == 2
        open_gate(cenv, "s1")
        assert holder.get(timeout=20) == "s1"
        assert linked.get(timeout=20) == "s1"
        assert after.get(timeout=20) == ["s1", "C"]
        for call in (linked.id, after.parent.id):
            [sent] = published(cenv, call)
            assert (sent["task"], sent["routing_key"]) == (work.name, q)
            assert (sent["answer"], sent["token"]) == (holder.id, None)
        wait_for(lambda: sorted(follows(cenv)) == [["C", "s1"], ["L", "s1"]], 10, "follows")
        assert [run["id"] for run in runs(cenv) if run["item"] == "s1"] == [holder.id]

    def test_an_answered_call_sent_twice_is_answered_once(
        self, cenv: CeleryEnv, publishing: Worker
    ) -> None:
        """A worker killed after sending an attached call and before forgetting it sends
        it again: the second message finds the call's outcome stored under its id and is
        dropped as a copy; the chain goes on once."""
        work, follow = cenv.app_module.work, cenv.app_module.follow
        q = publishing.queue
        holder = work.apply_async(("s3", UNTIL_OPENED), queue=q)
        running(cenv, "s3")
        after = chain(work.si("s3").set(queue=q), follow.s("D").set(queue=q)).apply_async()
        name = work.singleton_options().key.derive(("s3",), {})
        attachments = attachments_of(LockStores.for_app(cenv.app_module.app).lock)
        assert attachments is not None
        [kept] = attachments.listed(name)[1]
        open_gate(cenv, "s3")
        assert after.get(timeout=20) == ["s3", "D"]
        wait_for(lambda: follows(cenv) == [["D", "s3"]], 10, "the chain's next step")
        send_kept(cenv.app_module.app, kept.record, holder=holder.id)  # the second send
        wait_for(
            lambda: "copy of answered task dropped" in publishing.output(), 20, "the copy dropped"
        )
        assert follows(cenv) == [["D", "s3"]]
        assert after.parent.get(timeout=5) == "s3"
        assert [run["id"] for run in runs(cenv) if run["item"] == "s3"] == [holder.id]

    def test_a_promoted_call_is_sent_through_apply_async_with_its_hold(
        self, cenv: CeleryEnv, publishing: Worker
    ) -> None:
        """The holder's pool child killed: the worker's sweep (its main process) sends
        the attached step through apply_async with the hold its promotion took; it runs
        its body and its chain goes on."""
        work, follow = cenv.app_module.work, cenv.app_module.follow
        q = publishing.queue
        work.apply_async(("s2", UNTIL_OPENED), queue=q)
        first = running(cenv, "s2")
        after = chain(work.si("s2").set(queue=q), follow.s(1).set(queue=q)).apply_async()
        assert attached(cenv, "s2") == 1
        os.kill(first["pid"], signal.SIGKILL)
        assert after.get(timeout=30) == ["s2", 1]
        [sent] = published(cenv, after.parent.id)
        assert sent["pid"] == publishing.pid  # the sweep's, on the main process's timer
        assert sent["answer"] is None
        assert holder_task_id(sent["token"]) == after.parent.id
        assert [run["id"] for run in runs(cenv) if run["item"] == "s2"] == [after.parent.id]


@pytest.fixture(name="queue")
def fixture_queue(cenv: CeleryEnv) -> Iterator[redis.Redis]:
    broker = cenv.broker.client()
    broker.delete(QUEUE)
    yield broker
    broker.delete(QUEUE)


def kept_call(cenv: CeleryEnv, *args: object) -> tuple[str, str, bytes]:
    """A held call of ``work`` with a link, in a group, kept as the attach keeps it:
    Celery's own message for it, as its producer is handed it. (task id, token, record)"""
    app, work, follow = cenv.app_module.app, cenv.app_module.work, cenv.app_module.follow
    task_id = uuid()
    token = queued_token(task_id)
    headers, properties, body, _ = app.amqp.create_task_message(
        task_id,
        work.name,
        args,
        {},
        group_id="g-kept",
        group_index=3,
        callbacks=[follow.s("K")],
    )
    name = work.singleton_options().key.derive(args[:1], {})
    headers.update({NAME_HEADER: name, TOKEN_HEADER: token})
    publish = {"exchange": "", "routing_key": QUEUE, "headers": headers, **properties}
    record = kept_message(body, {**publish, "serializer": "json"})
    assert record is not None
    return task_id, token, record


def queued(broker: redis.Redis) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in reversed(broker.lrange(QUEUE, 0, -1))]


def body_of(message: dict[str, Any]) -> Any:
    return json.loads(base64.b64decode(message["body"]))


class TestWhereItsTaskIsUnknown:
    def test_a_kept_call_is_sent_through_apply_async_where_its_task_is_known_else_as_kept(
        self, cenv: CeleryEnv, queue: redis.Redis
    ) -> None:
        """The same kept call sent twice: promoted by a process that knows its task
        (Celery's publish signal sees it; its id, arguments, link, group and hold kept),
        then answered by an app that does not (the kept message published as it was,
        with the holder's id and no hold; no signal)."""
        app = cenv.app_module.app
        task_id, token, record = kept_call(cenv, "u1")
        seen: list[dict[str, Any]] = []

        def sent(headers: dict[str, Any] | None = None, **_: Any) -> None:
            seen.append(dict(headers or {}))

        notes = Transit(queue, "t")
        before = notes.noted()
        after_task_publish.connect(sent)
        bare = Celery("bare", set_as_current=False)
        bare.conf.update(app.conf.changes)  # the same servers, none of the tasks
        try:
            send_kept(app, record, holder=None)
            assert [h["id"] for h in seen] == [task_id]
            if app.conf.singleton_lock_ride_broker and not app.conf.get("broker_transport"):
                # Noted in transit by its publish, as every singleton call's message is.
                assert notes.noted() == before + 1
            send_kept(bare, record, holder="the-holder")
            assert len(seen) == 1
        finally:
            after_task_publish.disconnect(sent)
            bare.close()
        through, as_kept = queued(queue)
        for message in (through, as_kept):
            headers = message["headers"]
            assert (headers["id"], headers["group"], headers["group_index"]) == (
                task_id,
                "g-kept",
                3,
            )
            args, _, embed = body_of(message)
            assert args == ["u1"]
            assert [link["args"] for link in embed["callbacks"]] == [["K"]]
        assert through["headers"][TOKEN_HEADER] == token
        assert ANSWER_HEADER not in through["headers"]
        assert as_kept["headers"][ANSWER_HEADER] == "the-holder"
        assert TOKEN_HEADER not in as_kept["headers"]

    def test_a_kept_call_celery_refuses_to_build_is_sent_as_kept(
        self, cenv: CeleryEnv, queue: redis.Redis
    ) -> None:
        """Arguments the task does not take (as after a deploy that changed it): Celery's
        apply_async refuses to build the message; it is published as kept, for its run
        to fail where its canvas sees it, rather than kept for ever."""
        task_id, _, record = kept_call(cenv, "u2", 0.0, "ok", "one-too-many")
        send_kept(cenv.app_module.app, record, holder="the-holder")
        [message] = queued(queue)
        assert message["headers"]["id"] == task_id
        assert message["headers"][ANSWER_HEADER] == "the-holder"
        assert body_of(message)[0] == ["u2", 0.0, "ok", "one-too-many"]
