"""A run's release riding the write of its result (``broker.pushes.RidingRelease`` and
``results.RedisBackend``), on a real redis-server: the lock in database 1, the results
in database 0, as the default shape has them."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import redis
from celery import Celery, group
from celery.app.task import Context

from celery_singleton_lock import Lease, RedisLock, singleton_task
from celery_singleton_lock.broker import results
from celery_singleton_lock.broker.pushes import RidingRelease, pushes_of
from celery_singleton_lock.broker.results import RedisBackend

from ..conftest import CeleryEnv
from ..support.runs import wait_for
from ..support.servers import RedisServer
from ..support.workers import Worker


def at(server: RedisServer, db: int, **kwargs: object) -> redis.Redis:
    return redis.Redis.from_url(f"{server.url.rsplit('/', 1)[0]}/{db}", **kwargs)


@pytest.fixture(name="store")
def fixture_store(raw: redis.Redis, redis_server: RedisServer) -> Iterator[RedisLock]:
    client = at(redis_server, 1)
    yield RedisLock(client, prefix="rr")
    client.close()


def taken(store: RedisLock, name: str) -> Lease:
    lease = store.try_acquire(name, 30)
    assert isinstance(lease, Lease)
    return lease


def riding(store: RedisLock, name: str) -> tuple[Lease, RidingRelease]:
    """A lease on ``name`` and its release, to ride another client's pipeline."""
    lease = taken(store, name)
    pushes = pushes_of(store)
    assert pushes is not None
    release = pushes.riding_release(lease)
    assert release is not None
    return lease, release


class TestRidingRelease:
    def test_released_in_another_databases_transaction_which_keeps_its_own(
        self, store: RedisLock, redis_server: RedisServer
    ) -> None:
        lease, release = riding(store, "a")
        results = at(redis_server, 0)
        with results.pipeline() as pipe:
            release.add(pipe, 0)
            assert lease.released  # in flight: a racing renewal is no loss
            pipe.set("result", "done")
            pipe.get("result")  # after the script: still database 0
            replies = pipe.execute(raise_on_error=False)
        release.read(replies[0])
        assert replies[1:] == [True, b"done"]
        assert store.holder("a") is None
        assert lease.released
        assert not lease.lost
        assert at(redis_server, 1).get("result") is None

    def test_a_pipeline_that_never_ran_leaves_the_lease_to_ride_again(
        self, store: RedisLock, redis_server: RedisServer
    ) -> None:
        lease, release = riding(store, "b")
        with at(redis_server, 0).pipeline() as pipe:
            release.add(pipe, 0)
        assert release.unsent(redis.ConnectionError("the connection broke")) is False
        assert not lease.released
        assert store.holder("b") == lease.token
        with at(redis_server, 0).pipeline() as pipe:
            release.add(pipe, 0)
            release.read(pipe.execute(raise_on_error=False)[0])
        assert store.holder("b") is None

    def test_a_refused_transaction_stops_the_riding_and_the_release_goes_alone(
        self, store: RedisLock, redis_server: RedisServer
    ) -> None:
        lease, release = riding(store, "c")
        pushes = pushes_of(store)
        assert pushes is not None
        refused = redis.exceptions.ExecAbortError(
            "EXECABORT Transaction discarded because of previous errors."
        )
        assert release.unsent(refused) is True
        assert not lease.released
        assert pushes.riding_release(taken(store, "other")) is None  # for good
        release.alone()
        store.pipelining.read_owed()
        assert store.holder("c") is None

    def test_an_error_reply_releases_on_a_round_trip_of_its_own(self, store: RedisLock) -> None:
        lease, release = riding(store, "d")
        release.read(redis.ResponseError("an error in its place"))
        store.pipelining.read_owed()
        assert store.holder("d") is None
        assert lease.released


class TestBackend:
    # A write with nothing pending is Celery's own, which calls redis-py 8's deprecated setex.
    @pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")
    def test_an_app_with_a_singleton_task_resolves_redis_results_to_the_riding_backend(
        self, redis_server: RedisServer
    ) -> None:
        app = Celery("rides", set_as_current=False)
        app.conf.update(result_backend=redis_server.url, broker_url="memory://")
        try:
            singleton_task(app=app, name="rides.job", shared=False)(echo)
            assert type(app.backend) is RedisBackend
            # A write with nothing pending is Celery's own.
            app.backend.store_result("an-id", 5, "SUCCESS")
            assert app.AsyncResult("an-id").get(timeout=5) == 5
            assert at(redis_server, 0).ttl(app.backend.get_key_for_task("an-id")) > 0
        finally:
            app.close()

    def test_the_result_write_carries_the_release_and_keeps_celerys_expiry(
        self, redis_server: RedisServer
    ) -> None:
        base = redis_server.url.rsplit("/", 1)[0]
        app = Celery("carries", set_as_current=False)
        app.conf.update(
            result_backend=f"{base}/0", broker_url="memory://", singleton_lock_url=f"{base}/1",
            result_expires=600,
        )  # fmt: skip
        try:
            task = singleton_task(app=app, name="carries.job", shared=False)(echo)
            context = task.singleton_context
            lease = context.store.try_acquire("carried", 30)
            assert isinstance(lease, Lease)
            request = Context(id="run-1", is_eager=False, callbacks=None, chain=None, chord=None)
            assert results.release_with_result(task, request, context, lease)
            assert context.store.holder("carried") == lease.token  # until the write
            app.backend.store_result("run-1", 7, "SUCCESS")
            assert context.store.holder("carried") is None
            assert lease.released
            key = app.backend.get_key_for_task("run-1")
            assert 590 < at(redis_server, 0).ttl(key) <= 600
            assert app.AsyncResult("run-1").get(timeout=5) == 7
            # Nothing was written for a run (ignored result): released at its postrun.
            other = context.store.try_acquire("unwritten", 30)
            assert isinstance(other, Lease)
            request = Context(id="run-2", is_eager=False, callbacks=None, chain=None, chord=None)
            assert results.release_with_result(task, request, context, other)
            results.release_not_ridden(task, "run-2")
            context.store.pipelining.read_owed()
            assert context.store.holder("unwritten") is None
        finally:
            app.close()

    def test_the_result_write_says_whether_calls_are_attached_beside_the_lock(
        self, redis_server: RedisServer
    ) -> None:
        """A run of a mode that attaches asks in its result's write (its release riding):
        its end looks for attached calls only where there are some (``send_at_end``)."""
        base = redis_server.url.rsplit("/", 1)[0]
        app = Celery("tells", set_as_current=False)
        app.conf.update(
            result_backend=f"{base}/0", broker_url="memory://", singleton_lock_url=f"{base}/1"
        )
        try:
            task = singleton_task(app=app, name="tells.job", shared=False)(echo)
            context = task.singleton_context
            store = context.store
            for run, attached in (("run-a", False), ("run-b", True)):
                lease = store.try_acquire(run, 30)
                assert isinstance(lease, Lease)
                if attached:  # as an attach script keeps a call (its record's shape aside)
                    store.client.hset(store.keys(run).attached, "its-id", "{}")
                request = Context(id=run, is_eager=False, callbacks=None, chain=None, chord=None)
                assert results.release_with_result(task, request, context, lease)
                app.backend.store_result(run, 7, "SUCCESS")
                assert store.holder(run) is None
                assert app.backend.attached_told(run) is attached
                assert app.backend.attached_told(run) is None  # forgotten once asked
        finally:
            app.close()


class TestSubscriptions:
    """Celery's Redis backend subscribes to every sent task's result channel; ours
    subscribes as someone waits for a result, and no result is missed for it."""

    def test_a_sent_task_is_subscribed_to_only_while_its_result_is_waited_for(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        work, patient = cenv.app_module.work, cenv.app_module.patient
        backend = cenv.app_module.app.backend
        # The second run waits for a key this test holds, so it ends only once let go.
        store = patient.singleton_context.store
        held = store.try_acquire(patient.singleton_options().key.derive(("sub-held",)), 30)
        assert isinstance(held, Lease)
        done = work.apply_async(("sub-done",), queue=worker.queue)
        running = patient.apply_async(("sub-held",), queue=worker.queue)
        channels = [backend.get_key_for_task(r.id) for r in (done, running)]
        wait_for(lambda: backend.get_task_meta(done.id)["status"] == "SUCCESS", 20, "done")
        assert subscribers(backend, channels) == [0, 0]
        assert done.get(timeout=20) == "sub-done"  # stored before anyone waited: read
        answer: list[object] = []
        waiter = threading.Thread(target=lambda: answer.append(running.get(timeout=20)))
        waiter.start()
        try:
            wait_for(lambda: subscribers(backend, channels) == [0, 1], 10, "the waiter subscribed")
        finally:
            store.release(held)
            waiter.join(30)
        assert answer == ["sub-held"]  # published while it waited: received
        assert subscribers(backend, channels) == [0, 0]

    def test_a_groups_results_are_joined(self, cenv: CeleryEnv, worker: Worker) -> None:
        work = cenv.app_module.work
        joined = group(work.s(f"g{i}") for i in range(3)).apply_async(queue=worker.queue)
        assert joined.join_native(timeout=20) == ["g0", "g1", "g2"]


def subscribers(backend: RedisBackend, channels: list[str]) -> list[int]:
    """How many clients subscribe to each of ``channels`` on the result backend."""
    return [count for _, count in backend.client.pubsub_numsub(*channels)]


def echo(item: object) -> object:
    return item
