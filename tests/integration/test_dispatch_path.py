"""The fast paths: dispatch overlapping the lock's round trip, and lean script calls.

Against real Redis servers; no worker is needed, the broker's queue is read directly.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
import redis
from celery.signals import before_task_publish

from celery_singleton_lock import Contended, ExtendResult, Lease, RedisLock
from celery_singleton_lock.config.stores import LockStores
from celery_singleton_lock.lease import HOLD
from celery_singleton_lock.lease.redis import pipelining
from celery_singleton_lock.modes.debounce import Debounce
from celery_singleton_lock.tokens import (
    ETA_HEADER,
    NAME_HEADER,
    RATE_SLOT_HEADER,
    TOKEN_HEADER,
    debounced_token,
    read_slot,
)

from ..conftest import SAME_SERVER, CeleryEnv
from ..support.forks import in_forked_child
from ..support.runs import wait_for
from ..support.servers import RedisServer

QUEUE = "dispatch-path"


@pytest.fixture(name="queue")
def fixture_queue(cenv: CeleryEnv) -> Iterator[redis.Redis]:
    broker = cenv.broker.client()
    broker.delete(QUEUE)
    yield broker
    broker.delete(QUEUE)


def published(broker: redis.Redis) -> int:
    return int(broker.llen(QUEUE))


def handed_out_again_after(
    cenv: CeleryEnv, monkeypatch: pytest.MonkeyPatch, seconds: float
) -> None:
    """The broker hands an unacked message out again after ``seconds`` (for this test)."""
    conf = cenv.app_module.app.conf
    options = {**(conf.broker_transport_options or {}), "visibility_timeout": seconds}
    monkeypatch.setitem(conf, "broker_transport_options", options)


class TestOverlappedDispatch:
    def test_unique_is_published_with_its_hold_and_duplicates_are_not(
        self, cenv: CeleryEnv, queue: redis.Redis
    ) -> None:
        work = cenv.app_module.work
        first = work.apply_async(("p1",), queue=QUEUE)
        again = [work.apply_async(("p1",), queue=QUEUE) for _ in range(20)]
        assert {r.id for r in again} == {first.id}
        assert published(queue) == 1
        holder = cenv.lock_client().get(f"t:{{{work.singleton_options().key.derive(('p1',))}}}")
        assert holder is not None
        assert holder.decode().endswith(first.id)

    @pytest.mark.skipif(
        SAME_SERVER, reason="on the ridden path a receiver hears a duplicate (docs/design.md)"
    )
    def test_a_before_task_publish_receiver_never_hears_of_a_refused_duplicate(
        self, cenv: CeleryEnv, queue: redis.Redis
    ) -> None:
        heard: list[str] = []

        def receiver(headers: dict[str, Any] | None = None, **_: Any) -> None:
            heard.append((headers or {}).get("id", ""))

        work = cenv.app_module.work
        before_task_publish.connect(receiver, weak=False)
        try:
            first = work.apply_async(("p2",), queue=QUEUE)
            for _ in range(5):
                assert work.apply_async(("p2",), queue=QUEUE).id == first.id
        finally:
            before_task_publish.disconnect(receiver)
        assert heard == [first.id]
        assert published(queue) == 1

    def test_a_message_celery_refuses_to_build_gives_its_hold_back(
        self, cenv: CeleryEnv, queue: redis.Redis
    ) -> None:
        work = cenv.app_module.work
        # Celery parses the ETA after the send (its message differs between versions).
        with pytest.raises(ValueError, match=r"invalid literal|Expected 4 digits"):
            work.apply_async(("p3",), queue=QUEUE, expires="not-a-date")
        assert published(queue) == 0
        assert cenv.lock_client().keys("t:*") == []
        assert work.apply_async(("p3",), queue=QUEUE) is not None
        assert published(queue) == 1

    def test_headers_carry_key_and_token_of_the_granted_hold(
        self, cenv: CeleryEnv, queue: redis.Redis
    ) -> None:
        work = cenv.app_module.work
        work.apply_async(("p4",), queue=QUEUE)
        message = queue.lrange(QUEUE, 0, -1)[0]
        headers = json.loads(message)["headers"]
        key = headers[NAME_HEADER]
        assert cenv.lock_client().get(f"t:{{{key}}}").decode() == headers[TOKEN_HEADER]

    def test_concurrent_dispatchers_publish_one_message_per_key(
        self, cenv: CeleryEnv, queue: redis.Redis
    ) -> None:
        work = cenv.app_module.work
        barrier = threading.Barrier(6)
        errors: list[BaseException] = []

        def dispatch() -> None:
            try:
                barrier.wait(5)
                for i in range(30):
                    work.apply_async((f"c{i % 5}",), queue=QUEUE)
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=dispatch) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert not errors
        assert published(queue) == 5


class TestCountdownPastTheVisibilityTimeout:
    def test_a_countdown_the_broker_would_hand_out_again_is_sent_to_arrive_early(
        self, cenv: CeleryEnv, queue: redis.Redis, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # Waited out whole, kombu would hand the message out again while it waits.
        handed_out_again_after(cenv, monkeypatch, 100)
        work = cenv.app_module.work
        work.apply_async((f"soon-{time.monotonic_ns()}",), countdown=40, queue=QUEUE)
        sent_at = time.time()
        work.apply_async((f"late-{time.monotonic_ns()}",), countdown=500, queue=QUEUE)
        late, soon = (json.loads(m) for m in queue.lrange(QUEUE, 0, -1))
        assert ETA_HEADER not in soon["headers"], "within the timeout: as Celery sends it"
        eta = float(late["headers"][ETA_HEADER])
        assert eta == pytest.approx(sent_at + 500, abs=1.0)
        # Celery's own eta: one hop, half the timeout (an ISO time, the producer's clock).
        hop = datetime.fromisoformat(late["headers"]["eta"]).timestamp() - sent_at
        assert hop == pytest.approx(50, abs=1.0)

    def test_a_later_call_of_a_long_debounce_sends_its_successor_in_hops_too(
        self, cenv: CeleryEnv, queue: redis.Redis, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # A debounce of 0.5 s on a broker that hands a message out again after 0.6 s
        # (one hop: 0.3 s): each call of the burst sends the queued call on in hops.
        handed_out_again_after(cenv, monkeypatch, 0.6)
        debounced, item = cenv.app_module.debounced, f"burst-{time.monotonic_ns()}"
        first = debounced.apply_async((item, "v1"), queue=QUEUE)
        sent_at = time.time()
        later = debounced.apply_async((item, "v2"), queue=QUEUE)
        assert later.id == first.id
        newest = json.loads(queue.lrange(QUEUE, 0, -1)[0])
        assert newest["headers"]["argsrepr"] == repr((item, "v2"))
        hop = datetime.fromisoformat(newest["headers"]["eta"]).timestamp() - sent_at
        assert hop == pytest.approx(0.3, abs=0.1)
        eta = float(newest["headers"][ETA_HEADER])
        assert eta == pytest.approx(sent_at + 0.5, abs=0.1)

    def test_a_waiting_calls_place_lasts_its_countdown_too(
        self, cenv: CeleryEnv, queue: redis.Redis
    ) -> None:
        capped = cenv.app_module.capped  # max_pending: a place among the waiting calls
        item = f"place-{time.monotonic_ns()}"
        call = capped.apply_async((item,), countdown=30, queue=QUEUE)
        name = capped.singleton_options().key.derive((item,), {})
        place = LockStores.for_app(cenv.app_module.app).lock.keys(name).backlog
        client = cenv.lock_client()
        seconds, micros = client.time()
        left = float(client.zscore(place, call.id) or 0) / 1000 - seconds - micros / 1e6
        assert left == pytest.approx(capped.singleton_context.queue_ttl + 30, abs=1.0)

    def test_a_place_lasts_the_wait_its_slot_puts_the_call_off_by(
        self, cenv: CeleryEnv, queue: redis.Redis
    ) -> None:
        # on_limited="delay": the slot, and so the countdown, is known only after the
        # place was taken; a wait longer than half the queue_ttl renews the place.
        delayed = cenv.app_module.capped_delayed  # 1/m, queue_ttl=10
        item = f"place-{time.monotonic_ns()}"
        name = delayed.singleton_options().key.derive((item,), {})
        place = LockStores.for_app(cenv.app_module.app).lock.keys(name).backlog
        client = cenv.lock_client()

        def left(task_id: str) -> float:
            seconds, micros = client.time()
            return float(client.zscore(place, task_id) or 0) / 1000 - seconds - micros / 1e6

        now = delayed.apply_async((item,), queue=QUEUE)  # its slot is now
        later = delayed.apply_async((item,), queue=QUEUE)  # a minute on
        assert left(now.id) == pytest.approx(10, abs=1.0)
        assert left(later.id) == pytest.approx(10 + 60, abs=2.0)

    def test_a_wait_within_half_the_queue_ttl_leaves_the_place_as_taken(
        self, cenv: CeleryEnv, queue: redis.Redis
    ) -> None:
        soon = cenv.app_module.capped_soon  # 1/4s, queue_ttl=10: a wait of 4 s
        item = f"place-{time.monotonic_ns()}"
        place = self._place(cenv, soon, item)
        soon.apply_async((item,), queue=QUEUE)
        later = soon.apply_async((item,), queue=QUEUE)
        assert self._left(cenv, place, later.id) == pytest.approx(10, abs=1.0)
        eta = json.loads(queue.lrange(QUEUE, 0, -1)[0])["headers"]["eta"]
        assert datetime.fromisoformat(eta).timestamp() - time.time() == pytest.approx(4, abs=1)

    def test_a_wait_cut_into_hops_keeps_the_place_for_the_first_hop(
        self, cenv: CeleryEnv, queue: redis.Redis, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # A broker that hands a message out again after 40 s: the call waiting a minute
        # for its slot goes in hops of 20 s, and each hop renews its place (its run's
        # ``run/places.keep_place``), so the place need only last the first.
        handed_out_again_after(cenv, monkeypatch, 40)
        delayed = cenv.app_module.capped_delayed  # 1/m, queue_ttl=10
        item = f"place-{time.monotonic_ns()}"
        place = self._place(cenv, delayed, item)
        delayed.apply_async((item,), queue=QUEUE)
        sent_at = time.time()
        later = delayed.apply_async((item,), queue=QUEUE)
        assert self._left(cenv, place, later.id) == pytest.approx(10 + 20, abs=2.0)
        headers = json.loads(queue.lrange(QUEUE, 0, -1)[0])["headers"]
        assert datetime.fromisoformat(headers["eta"]).timestamp() - sent_at == pytest.approx(
            20, abs=1
        )
        slot = read_slot(headers[RATE_SLOT_HEADER])
        assert slot is not None
        assert slot[0] - sent_at == pytest.approx(60, abs=2)

    def test_a_call_not_sent_after_its_place_was_renewed_gives_it_back(
        self, cenv: CeleryEnv, queue: redis.Redis
    ) -> None:
        delayed = cenv.app_module.capped_delayed
        item = f"place-{time.monotonic_ns()}"
        place = self._place(cenv, delayed, item)
        first = delayed.apply_async((item,), queue=QUEUE)
        # Celery parses ``expires`` as it builds the message: after the place was taken
        # and renewed for the minute's wait, before anything was sent.
        with pytest.raises(ValueError, match=r"invalid literal|Expected 4 digits"):
            delayed.apply_async((item,), queue=QUEUE, expires="not-a-date")
        client = cenv.lock_client()
        assert [m.decode() for m in client.zrange(place, 0, -1)] == [first.id]
        assert published(queue) == 1

    @staticmethod
    def _place(cenv: CeleryEnv, task: Any, item: str) -> str:
        """The key of ``task``'s places among the calls of ``item`` waiting."""
        name = task.singleton_options().key.derive((item,), {})
        return str(LockStores.for_app(cenv.app_module.app).lock.keys(name).backlog)

    @staticmethod
    def _left(cenv: CeleryEnv, place: str, task_id: str) -> float:
        """Seconds left of ``task_id``'s place, by the lock server's clock."""
        client = cenv.lock_client()
        seconds, micros = client.time()
        return float(client.zscore(place, task_id) or 0) / 1000 - seconds - micros / 1e6


class TestDebounceSuccessor:
    def test_its_window_ends_by_max_wait_whatever_the_call_was_sent_to_hop_to(self) -> None:
        began = time.time() - 1.3  # the burst began 1.3 s ago: 0.2 s of max_wait left
        holder = debounced_token("id-1", began)
        stale = {"countdown": 0.3, "headers": {ETA_HEADER: f"{time.time() + 0.5}", "x": "y"}}
        _, ttl, options = Debounce(0.5, 1.5).successor("id-1", holder, stale, 1.0, 10.0)
        assert options["countdown"] == pytest.approx(0.2, abs=0.05)
        assert options["headers"] == {"x": "y"}
        assert ttl == pytest.approx(10.2, abs=0.05)


class TestLeanCalls:
    def test_acquire_by_the_holders_own_token_is_granted_again(self, lock: RedisLock) -> None:
        first = lock.try_acquire("own", 10, token="tok-1")
        assert isinstance(first, Lease)
        again = lock.try_acquire("own", 10, token="tok-1")
        assert isinstance(again, Lease)
        assert again.fence > first.fence
        assert isinstance(lock.try_acquire("own", 10, token="tok-2"), Contended)

    def test_unfenced_hold_has_fence_zero_and_writes_no_fence_key(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        hold = lock.try_acquire("quiet", 10, take=HOLD)
        assert isinstance(hold, Lease)
        assert hold.fence == 0
        assert raw.exists(lock.keys("quiet").fence) == 0

    def test_script_flushed_from_the_server_is_reloaded(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        assert isinstance(lock.try_acquire("flushed-1", 10), Lease)
        raw.script_flush()
        lease = lock.try_acquire("flushed-2", 10)
        assert isinstance(lease, Lease)
        raw.script_flush()
        assert lock.release(lease).name == "RELEASED"

    def test_killed_connection_is_replaced_and_the_call_retried(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        assert isinstance(lock.try_acquire("killed-1", 10), Lease)
        raw.client_kill_filter(_type="normal", skipme=True)
        lease = lock.try_acquire("killed-2", 10)
        assert isinstance(lease, Lease)
        assert raw.get(lease.key) is not None

    def test_begin_then_outcome_overlaps_other_calls_on_the_same_thread(
        self, lock: RedisLock
    ) -> None:
        pending = lock.begin_try_acquire("nested-1", 10)
        # The thread's own connection waits on that reply; this call borrows another.
        inner = lock.try_acquire("nested-2", 10)
        outcome = pending.outcome()
        assert isinstance(outcome, Lease)
        assert isinstance(inner, Lease)
        assert pending.outcome() is outcome

    def test_presumed_lease_of_an_unfenced_hold_renews_and_releases(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        pending = lock.begin_try_acquire("presumed", 10, take=HOLD)
        lease = pending.lease_if_granted()
        assert lease is not None
        assert lease.token == pending.outcome().token  # type: ignore[union-attr]
        assert lock.extend(lease).name == "EXTENDED"
        assert lock.release(lease).name == "RELEASED"
        assert raw.exists(lease.key) == 0

    def test_presumed_lease_of_a_fenced_acquire_has_its_fence_once_read(
        self, lock: RedisLock
    ) -> None:
        pending = lock.begin_try_acquire("fenced", 10)
        presumed = pending.lease_if_granted()
        assert presumed is not None
        assert presumed.fence == 0  # not known before the answer
        assert lock.extend(presumed).name == "EXTENDED"  # renewable meanwhile
        outcome = pending.outcome()
        assert isinstance(outcome, Lease)
        assert outcome.fence > 0
        assert outcome.token == presumed.token
        assert pending.lease_if_granted() is outcome


def kept(lock: RedisLock) -> set[object]:
    """The connection the lock's transport keeps between calls (none or one)."""
    return set(lock.pipelining._idle or ())


def closed(conn: object) -> bool:
    """Whether the server closed ``conn`` (its end of file is readable)."""
    try:
        return bool(conn.can_read())  # type: ignore[attr-defined]
    except redis.ConnectionError:
        return True


def gone_soon(raw: redis.Redis, key: str, timeout: float = 2.0) -> bool:
    """Whether ``key`` is gone within ``timeout`` (another connection's write may land
    a moment after this one looks)."""
    deadline = time.monotonic() + timeout
    while raw.exists(key):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def calls(raw: redis.Redis, command: str) -> int:
    return int(raw.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


class TestScriptlessHolds:
    """Unfenced holds use SET NX GET and PTTL, pipelined, where the server has them."""

    @pytest.mark.usefixtures("redis7")
    def test_a_hold_is_taken_without_a_script(self, lock: RedisLock, raw: redis.Redis) -> None:
        raw.config_resetstat()
        # The transport's first hold goes through the script: a user who may not run
        # scripts is refused before a SET it could not give back.
        lock.try_acquire("first", 10, take=HOLD)
        assert calls(raw, "evalsha") + calls(raw, "eval") == 1
        raw.config_resetstat()
        hold = lock.try_acquire("plain", 10, token="tok-a", take=HOLD)
        assert isinstance(hold, Lease)
        assert raw.get(hold.key) == b"tok-a"
        assert 9000 < raw.pttl(hold.key) <= 10000
        assert calls(raw, "evalsha") == 0
        assert calls(raw, "set") == 1

    def test_a_refused_hold_names_the_holder_and_its_time_left(self, lock: RedisLock) -> None:
        lock.try_acquire("taken", 10, token="tok-a", take=HOLD)
        refused = lock.try_acquire("taken", 5, token="tok-b", take=HOLD)
        assert isinstance(refused, Contended)
        assert refused.holder == "tok-a"
        assert refused.retry_after is not None
        assert 9 < refused.retry_after <= 10

    def test_the_holders_own_token_is_granted_again(self, lock: RedisLock) -> None:
        # Both client flavours (bytes and decode_responses) through the lock fixture.
        assert isinstance(lock.try_acquire("own", 10, token="tok-1", take=HOLD), Lease)
        assert isinstance(lock.try_acquire("own", 10, token="tok-1", take=HOLD), Lease)
        assert isinstance(lock.try_acquire("own", 10, token="tok-2", take=HOLD), Contended)

    @pytest.mark.usefixtures("redis7")
    def test_a_foreign_value_at_the_key_is_answered_by_the_script(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        raw.rpush(lock.keys("list").lock, "not a lock")  # SET ... GET: WRONGTYPE
        refused = lock.try_acquire("list", 10, take=HOLD)
        assert isinstance(refused, Contended)
        assert refused.holder == ""
        assert lock.pipelining.holds  # a one-off refusal, not an old server

    def test_a_server_without_set_nx_get_is_remembered_and_answered_by_the_script(
        self, lock: RedisLock, raw: redis.Redis, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # NX with XX is a syntax error on every server: the answer Redis < 7.0 gives to
        # NX with GET.
        monkeypatch.setattr(pipelining, "HOLD_OPTIONS", ("NX", "XX", "GET"))
        lock.try_acquire("warm", 10, take=HOLD)  # the first hold: by script
        raw.config_resetstat()
        first = lock.try_acquire("old-1", 10, token="tok-a", take=HOLD)
        assert isinstance(first, Lease)
        assert not lock.pipelining.holds
        assert isinstance(lock.try_acquire("old-1", 10, token="tok-b", take=HOLD), Contended)
        assert isinstance(lock.try_acquire("old-2", 10, take=HOLD), Lease)
        assert calls(raw, "evalsha") == 3  # every hold, the first one after its refusal
        assert raw.get(lock.keys("old-1").lock) == b"tok-a"

    def test_the_connection_stays_in_step_for_later_calls(self, lock: RedisLock) -> None:
        for n in range(50):
            pending = lock.begin_try_acquire(f"step-{n % 5}", 10, token=f"t{n}", take=HOLD)
            lease = lock.try_acquire(f"other-{n}", 10)  # borrows a second connection
            assert isinstance(lease, Lease)
            outcome = pending.outcome()
            assert isinstance(outcome, Lease) == (n < 5)
            assert lock.release(lease).name == "RELEASED"


class TestAnswersReadLater:
    def test_a_release_sent_without_waiting_frees_the_key_at_once(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        lease = lock.acquire("later", 10)
        lock.release_nowait(lease)
        # Redis runs it with no further call from this lock; only its answer waits.
        assert gone_soon(raw, lease.key)
        assert lease.released

    def test_it_frees_the_key_on_a_server_that_forgot_the_script(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        # A restarted or flushed server answers a script's digest with NOSCRIPT; were
        # that answer read only with the next call, the key would stay held until then.
        lease = lock.acquire("forgot", 10)
        raw.script_flush()
        lock.release_nowait(lease)
        assert gone_soon(raw, lease.key)
        assert isinstance(lock.try_acquire("forgot", 10), Lease)
        assert not lock.pipelining._owed

    def test_its_answer_is_read_before_the_threads_next_call(
        self, lock: RedisLock, raw: redis.Redis, caplog: pytest.LogCaptureFixture
    ) -> None:
        lease = lock.acquire("later-lost", 10)
        raw.set(lease.key, "someone else")
        lock.release_nowait(lease)
        assert not lease.lost  # not read yet
        with caplog.at_level("INFO", logger="celery_singleton_lock.lease.redis.common"):
            assert isinstance(lock.try_acquire("later-next", 10), Lease)
        assert lease.lost
        assert "NOT_OWNER" in caplog.text
        assert raw.get(lease.key) == b"someone else"

    def test_every_connection_goes_back_once_its_answers_are_read(self, lock: RedisLock) -> None:
        lease = lock.acquire("borrowed", 10)
        pending = lock.begin_try_acquire("other", 10)  # one connection waits on this answer
        lock.release_nowait(lease)  # so this takes a second one from the pool
        assert isinstance(pending.outcome(), Lease)
        assert isinstance(lock.try_acquire("third", 10), Lease)
        assert not lock.pipelining._owed
        in_use = lock.client.connection_pool._in_use_connections  # type: ignore[attr-defined]
        assert in_use == kept(lock)  # none is kept by a thread; one by the transport

    def test_the_connection_of_an_answer_read_later_serves_the_next_call(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        for n in range(20):  # a task's release, then the next task's acquire, and so on
            lease = lock.try_acquire(f"task-{n}", 10)
            assert isinstance(lease, Lease)
            lock.release_nowait(lease)
        lock.pipelining.read_owed()
        pool = lock.client.connection_pool
        available = pool._available_connections  # type: ignore[attr-defined]
        assert len(available) + len(kept(lock)) == 1
        assert not list(raw.scan_iter("test:{task-*}"))

    def test_a_forked_child_never_reads_its_parents_owed_answers(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        lease = lock.acquire("parent", 10)
        lock.release_nowait(lease)  # owed, on a connection the child inherits
        assert in_forked_child(
            lambda: isinstance(lock.try_acquire("child", 10), Lease) and not lock.pipelining._owed
        )
        assert lock.pipelining._owed  # the parent's answer is still the parent's to read
        lock.pipelining.read_owed()
        assert lease.released
        assert not lease.lost
        assert raw.exists(lease.key) == 0

    def test_an_answer_owed_by_a_thread_that_ended_is_read_by_another(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        lease = lock.acquire("ended", 10)
        worker = threading.Thread(target=lock.release_nowait, args=(lease,))
        worker.start()
        worker.join(5)
        assert gone_soon(raw, lease.key)
        assert lock.pipelining._owed  # its answer waits, with its connection
        assert isinstance(lock.try_acquire("next", 10), Lease)  # from this thread
        assert not lock.pipelining._owed
        in_use = lock.client.connection_pool._in_use_connections  # type: ignore[attr-defined]
        assert in_use == kept(lock)

    def test_a_broken_connection_retries_the_release(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        assert isinstance(lock.try_acquire("warm", 10), Lease)
        raw.client_kill_filter(_type="normal", skipme=True)
        lease = lock.acquire("later-broken", 10)  # on a fresh connection
        lock.release_nowait(lease)
        lock.try_acquire("later-after", 10)
        assert raw.exists(lease.key) == 0


class TestKeptConnection:
    """A transport keeps one connection between calls, lent by a pool with room."""

    def test_one_connection_serves_consecutive_calls(self, lock: RedisLock) -> None:
        lease = lock.acquire("kept", 10)
        [conn] = kept(lock)
        assert lock.holder("kept") == lease.token
        lock.release(lease)
        assert kept(lock) == {conn}
        pool = lock.client.connection_pool
        assert pool._in_use_connections == {conn}  # type: ignore[attr-defined]

    def test_a_kept_connection_the_server_closed_is_reconnected(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        assert lock.holder("closed") is None
        assert kept(lock)
        raw.client_kill_filter(_type="normal", skipme=True)
        lease = lock.acquire("closed", 10)
        assert lock.holder("closed") == lease.token
        lock.release(lease)
        assert raw.exists(lease.key) == 0

    def test_a_renewal_on_a_kept_connection_the_server_closed_is_not_failed(
        self, lock: RedisLock, raw: redis.Redis
    ) -> None:
        """A renewal is never retried by redis-py (``retry=False``): the connection it
        is lent must be one the pool would lend, not one the server closed meanwhile."""
        lease = lock.acquire("renewed", 10)
        [conn] = kept(lock)
        raw.client_kill_filter(_type="normal", skipme=True)
        wait_for(lambda: closed(conn), 5, "the server closed the kept connection")
        assert lock.extend(lease, retry=False) == ExtendResult.EXTENDED
        lock.release(lease)

    def test_a_small_pool_gets_every_connection_back(self, redis_server: RedisServer) -> None:
        pool = redis.BlockingConnectionPool.from_url(redis_server.url, max_connections=1, timeout=1)
        client = redis.Redis(connection_pool=pool)
        small = RedisLock(client, prefix="small")
        try:
            lease = small.acquire("one", 10)
            assert not kept(small)
            assert client.get(lease.key) is not None  # the pool's one connection is free
            small.release(lease)
            assert client.exists(lease.key) == 0
        finally:
            client.close()

    def test_a_forked_child_never_uses_its_parents_kept_connection(self, lock: RedisLock) -> None:
        assert lock.holder("fork") is None
        [conn] = kept(lock)

        def child() -> bool:
            lease = lock.acquire("child", 10)
            return conn not in kept(lock) and lock.holder("child") == lease.token

        assert in_forked_child(child)
        assert kept(lock) == {conn}
        assert lock.holder("fork") is None  # the parent's connection is still in step


class TestWhatCeleryRefuses:
    """A countdown, eta or expires plain Celery refuses is refused with Celery's exception,
    before any hold, place or slot is taken (the library changes a call's delay before
    Celery sees it: a long countdown in hops, a rate's slot)."""

    @pytest.mark.parametrize(
        "options",
        [
            {"countdown": float("inf")},
            {"countdown": 1e12},
            {"countdown": float("nan")},
            {"countdown": -3e9},
            {"countdown": "soon"},
            {"expires": float("inf")},
            {"eta": 1234},
        ],
        ids=["inf", "1e12", "nan", "below-int-min", "a-string", "expires-inf", "eta-a-number"],
    )
    def test_with_plain_celerys_exception_and_nothing_left(
        self, cenv: CeleryEnv, queue: redis.Redis, options: dict[str, object]
    ) -> None:
        app = cenv.app_module
        with pytest.raises(Exception) as plain:  # noqa: PT011  (whichever Celery raises)
            app.plain.apply_async(("refused",), queue=QUEUE, **options)
        # held (riding the push), sent in line with a rate's slot, with a place and a slot
        for task in (app.work, app.delayed, app.capped_delayed):
            with pytest.raises(type(plain.value)):
                task.apply_async(("refused",), queue=QUEUE, **options)
        assert published(queue) == 0
        assert cenv.lock_client().keys("*") == []

    def test_a_far_countdown_celery_takes_is_still_taken(
        self, cenv: CeleryEnv, queue: redis.Redis
    ) -> None:
        # A year: Celery makes it an eta; past the broker's visibility_timeout, it hops.
        cenv.app_module.work.apply_async(("far",), queue=QUEUE, countdown=365 * 86400)
        assert published(queue) == 1
