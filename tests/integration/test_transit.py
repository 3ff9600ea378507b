"""Messages lost between the broker's pop and a worker's receipt are pushed again.

kombu's Redis transport pops a message (BRPOP) before it records it as unacked; a
worker killed in between loses it (celery/celery#7950). A singleton message pushed with
its hold is noted in transit (``broker.transit``), the note is cleared in the pipeline
that records it unacked, and workers sweep for notes of messages found nowhere.

Here the loss is made by hand: the message is popped from its list by a client that
then never records it, exactly what a worker SIGKILLed after its BRPOP leaves behind
(the soak in tests/chaos/test_mode_soak.py kills real workers).
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass

import pytest
import redis

from celery_singleton_lock.broker.pushes import Push, pushes_of
from celery_singleton_lock.broker.transit import PUSH, PUSH_SHA, ClearNote, Note, Transit
from celery_singleton_lock.lease import HOLD, RedisLock
from celery_singleton_lock.lease.redis.pipelining import Pipelining

from ..conftest import CeleryEnv
from ..support.runs import wait_for
from ..support.same_server import QUEUE, at, holds, produce, same_server_env
from ..support.servers import RedisServer
from ..support.topologies import SentinelGroup
from ..support.workers import Worker

WAIT = 0.2  # the notes' wait in the lease tests, seconds


@pytest.fixture(name="store")
def fixture_store(raw: redis.Redis) -> RedisLock:
    return RedisLock(raw, prefix="tt")


@pytest.fixture(name="notes")
def fixture_notes(raw: redis.Redis) -> Transit:
    return Transit(raw, "tt")


def pushed(store: RedisLock, name: str, tag: str, *, alone: bool = False) -> Push:
    """A message pushed with its hold (``alone``: the hold taken first, then the message
    pushed with its note, as with a lock store on another server)."""
    payload = json.dumps({"tag": tag})
    note = Note(tag, name, f"q-{tag}", 60, WAIT, "tt")
    push = Push("queue", payload, note=note)
    if alone:
        assert store.try_acquire(name, 60, token=f"q-{tag}", take=HOLD).token == f"q-{tag}"
        Transit(store.client, "tt").push("queue", payload, note)
    else:
        pushes = pushes_of(store)
        assert pushes is not None
        assert pushes.hold_and_push(name, 60, push, token=f"q-{tag}").token == f"q-{tag}"
    return push


def sweep(store: RedisLock, notes: Transit) -> list[str]:
    return notes.sweep(
        "unacked", lambda name, token: not name or store.holder(name) == token, wait=WAIT
    )


def sweep_until(store: RedisLock, notes: Transit, *, rounds: int = 3) -> list[str]:
    """Sweep ``rounds`` times, a wait apart; every tag pushed again."""
    again: list[str] = []
    for _ in range(rounds):
        time.sleep(WAIT + 0.05)
        again += sweep(store, notes)
    return again


class TestNotes:
    def test_a_pushed_message_is_noted_and_its_receipt_clears_the_note(
        self, store: RedisLock, notes: Transit, raw: redis.Redis
    ) -> None:
        pushed(store, "a", "tag-a")
        assert notes.noted() == 1
        clear = ClearNote("tt", "tag-a")
        # The worker's receipt: popped, then recorded as unacked with the clear riding.
        assert raw.rpop("queue") is not None
        with raw.pipeline() as pipe:
            clear.add(pipe, 0)
            pipe.hset("unacked", "tag-a", "...")
            replies = pipe.execute()
        clear.read(replies[0])
        assert notes.noted() == 0
        assert sweep_until(store, notes) == []
        assert raw.llen("queue") == 0

    @pytest.mark.parametrize("cached", [True, False], ids=["cached", "after a flush"])
    def test_a_push_on_the_channels_own_connections_is_noted_once(
        self, notes: Transit, raw: redis.Redis, cached: bool
    ) -> None:
        """A noted push sent on connections driven directly (``Pipelining``, as a riding
        channel's): pushed and noted once, also where the server forgot the script."""
        via = Pipelining(raw)
        assert via.direct
        payload = json.dumps({"tag": "tag-d"})
        if cached:
            raw.script_load(PUSH)
        else:
            raw.script_flush()
        notes.push("queue", payload, Note("tag-d", "d", "q-d", 60, WAIT, "tt"), via=via)
        assert raw.lrange("queue", 0, -1) == [payload.encode()]
        assert notes.noted() == 1
        assert raw.script_exists(PUSH_SHA) == [True]

    @pytest.mark.parametrize("alone", [False, True], ids=["riding", "lock store apart"])
    def test_a_message_popped_and_never_recorded_is_pushed_again_once(
        self, store: RedisLock, notes: Transit, raw: redis.Redis, alone: bool
    ) -> None:
        push = pushed(store, "b", "tag-b", alone=alone)
        assert raw.rpop("queue") == push.payload.encode()  # the worker died right here
        time.sleep(WAIT + 0.05)
        assert sweep(store, notes) == []  # first seen missing: looked at again
        assert raw.llen("queue") == 0
        time.sleep(WAIT + 0.05)
        assert sweep(store, notes) == ["tag-b"]
        assert raw.lrange("queue", 0, -1) == [push.payload.encode()]  # byte for byte
        assert sweep_until(store, notes) == []  # queued again: nothing more
        assert raw.llen("queue") == 1
        assert raw.get(store.keys("b").lock) == b"q-tag-b"  # the hold stands throughout

    def test_a_message_queued_behind_one_pushed_again_is_never_pushed_twice(
        self, store: RedisLock, notes: Transit, raw: redis.Redis
    ) -> None:
        first = pushed(store, "d1", "tag-d1")
        behind = pushed(store, "d2", "tag-d2")  # popped after it (a list is FIFO)
        assert raw.rpop("queue") == first.payload.encode()  # its worker died right here
        assert sweep_until(store, notes, rounds=2) == ["tag-d1"]  # back at the pop end
        # Received at last: popped and recorded, its note cleared in that pipeline.
        assert raw.rpop("queue") == first.payload.encode()
        with raw.pipeline() as pipe:
            ClearNote("tt", "tag-d1").add(pipe, 0)
            pipe.hset("unacked", "tag-d1", "...")
            pipe.execute()
        # The one behind it never left the queue: it is never pushed a second time.
        assert sweep_until(store, notes, rounds=4) == []
        assert raw.lrange("queue", 0, -1) == [behind.payload.encode()]

    def test_a_message_pushed_again_after_later_ones_were_received_is_not_pushed_twice(
        self, store: RedisLock, notes: Transit, raw: redis.Redis
    ) -> None:
        first = pushed(store, "e1", "tag-e1")
        later = pushed(store, "e2", "tag-e2")
        assert raw.rpop("queue") == first.payload.encode()  # lost
        assert raw.rpop("queue") == later.payload.encode()  # received: its number counts
        with raw.pipeline() as pipe:
            ClearNote("tt", "tag-e2").add(pipe, 0)
            pipe.hset("unacked", "tag-e2", "...")
            pipe.execute()
        assert sweep_until(store, notes, rounds=2) == ["tag-e1"]
        # Queued again at the end popped next, older than what was received: looked for
        # there, found, and left alone.
        assert sweep_until(store, notes, rounds=4) == []
        assert raw.lrange("queue", 0, -1) == [first.payload.encode()]

    def test_a_message_received_as_the_sweep_looked_is_not_pushed_again(
        self, store: RedisLock, notes: Transit, raw: redis.Redis
    ) -> None:
        pushed(store, "c", "tag-c")
        raw.rpop("queue")
        time.sleep(WAIT + 0.05)
        assert sweep(store, notes) == []  # missing: popped a moment ago
        raw.hset("unacked", "tag-c", "...")  # ... and recorded (no clear rode: kombu's own)
        assert sweep_until(store, notes) == []
        assert raw.llen("queue") == 0
        assert notes.noted() == 0  # unacked: kombu restores it if need be

    @pytest.mark.parametrize("how", ["taken over", "released", "expired"])
    def test_a_message_whose_hold_moved_on_is_forgotten(
        self, store: RedisLock, notes: Transit, raw: redis.Redis, how: str
    ) -> None:
        pushed(store, "d", "tag-d")
        raw.rpop("queue")
        key = store.keys("d").lock
        if how == "taken over":
            raw.set(key, "running-token")  # a receipt's take, or a replacing call's swap
        elif how == "released":
            raw.delete(key)
        else:
            raw.pexpire(key, 1)
        assert sweep_until(store, notes) == []
        assert raw.llen("queue") == 0
        assert notes.noted() == 0

    def test_a_note_ends_with_its_hold(
        self, store: RedisLock, notes: Transit, raw: redis.Redis
    ) -> None:
        note = Note("tag-i", "i", "q-tag-i", 0.3, WAIT, "tt")
        pushes = pushes_of(store)
        assert pushes is not None
        pushes.hold_and_push("i", 0.3, Push("queue", "i", note=note), token="q-tag-i")
        raw.persist(store.keys("i").lock)  # the hold outlives its ttl: the note does not
        raw.rpop("queue")
        assert sweep_until(store, notes, rounds=4) == []
        assert notes.noted() == 0

    def test_a_long_queued_message_is_looked_at_less_and_less_often(
        self, store: RedisLock, notes: Transit, raw: redis.Redis
    ) -> None:
        pushed(store, "e", "tag-e")
        looks = []
        end = time.monotonic() + 2.0
        while time.monotonic() < end:  # a sweep every 20 ms, for 2 s
            sweep(store, notes)
            score = raw.zscore(notes.due, "tag-e")
            assert score is not None
            if not looks or score != looks[-1]:
                looks.append(score)
            time.sleep(0.02)
        # Due after the wait, then after as long again as it has waited: 0.2, 0.4, 0.8,
        # 1.6 s (a sweep every wait would have looked ten times).
        gaps = [b - a for a, b in itertools.pairwise(looks)]
        assert 3 <= len(looks) <= 5, looks
        assert gaps == sorted(gaps), gaps
        assert raw.llen("queue") == 1

    def test_behind_a_long_backlog_a_later_receipt_tells_a_message_is_gone(
        self, store: RedisLock, notes: Transit, raw: redis.Redis
    ) -> None:
        push = pushed(store, "j", "tag-j")
        raw.lpush("queue", *[f"plain-{i}" for i in range(1500)])  # others' calls behind it
        assert raw.rpop("queue") == push.payload.encode()  # taken, and the worker died
        # Its list is longer than a look reads: it may still be queued, as far as a
        # look can tell, so it is left alone.
        assert sweep_until(store, notes) == []
        assert raw.llen("queue") == 1500
        # A call pushed after it is received: a list is popped in order, so it is gone.
        pushed(store, "k", "tag-k")
        with raw.pipeline() as pipe:
            ClearNote("tt", "tag-k").add(pipe, 0)
            pipe.execute()
        # (Looked at less often by now: at its next look, then a wait later.)
        assert sweep_until(store, notes, rounds=10) == ["tag-j"]
        assert raw.lindex("queue", -1) == push.payload.encode()  # popped next
        assert sweep_until(store, notes) == []  # numbered anew: not gone again
        assert raw.llen("queue") == 1502

    def test_a_purge_drops_the_notes_and_names_the_holds(
        self, store: RedisLock, notes: Transit, raw: redis.Redis
    ) -> None:
        pushed(store, "g", "tag-g")
        pushed(store, "h", "tag-h", alone=True)
        raw.delete("queue")
        assert sorted(notes.purged(["queue"])) == [("g", "q-tag-g"), ("h", "q-tag-h")]
        assert notes.noted() == 0
        assert sweep_until(store, notes) == []


def steal(broker: redis.Redis, queue: str) -> dict[str, object]:
    """Pop a message as a worker killed right after its BRPOP would: never recorded."""
    raw = broker.rpop(queue)
    assert raw is not None
    return dict(json.loads(raw))


@dataclass(frozen=True)
class Shape:
    env: dict[str, str]
    broker: redis.Redis
    locks: redis.Redis
    queue: str = QUEUE  # the list's key, as the server names it


def shaped(shape: str, shared: RedisServer, cenv: CeleryEnv, **extra: str) -> Shape:
    """The environment, broker client and lock client of a shape: the locks in database
    1 of the broker's server ("riding"; "prefixed": with kombu's global_keyprefix), or
    on a server of their own ("apart")."""
    if shape == "riding":
        return Shape(same_server_env(shared, cenv, **extra), at(shared, 0), at(shared, 1))
    if shape == "prefixed":
        env = same_server_env(shared, cenv, CSL_KEYPREFIX="pre:", **extra)
        return Shape(env, at(shared, 0), at(shared, 1), queue=f"pre:{QUEUE}")
    broker = cenv.broker.client()
    broker.delete(QUEUE)
    return Shape({**cenv.env, "CSL_QUEUE": QUEUE, **extra}, broker, cenv.lock_client())


SHAPES = ["riding", "apart"]


def notes_of(broker: redis.Redis, queue: str) -> int:
    """How many messages of ``queue`` are noted in transit (the broker is shared with
    the other Celery tests, whose notes wait out their own holds)."""
    return sum(json.loads(raw)[2] == queue for raw in broker.hvals("t:transit"))


def settled(broker: redis.Redis, queue: str, worker: Worker) -> bool:
    """Whether no call of ``queue`` can run any more: none noted in transit (only a
    noted message is pushed again, and it stays noted until a worker receives it), none
    queued, and none running, reserved or scheduled in ``worker``. Checked in that order,
    so a message moving on between two looks is seen at the next."""
    return notes_of(broker, queue) == 0 and broker.llen(queue) == 0 and worker.idle()


class TestWorkers:
    @pytest.mark.parametrize(
        ("shape", "task"),
        [
            ("riding", "work"),
            ("apart", "work"),
            ("prefixed", "work"),
            ("riding", "soak_tasks['limit']"),
        ],
        ids=["riding", "apart", "kombu key prefix", "limit (no hold of its own)"],
    )
    def test_a_call_lost_in_transit_runs_once_and_frees_its_key(
        self, shared: RedisServer, cenv: CeleryEnv, shape: str, task: str
    ) -> None:
        setup = shaped(shape, shared, cenv, CSL_TRANSIT_TIMEOUT="1")
        env, broker, locks = setup.env, setup.broker, setup.locks
        checker = cenv.checker_client()
        checker.delete("runs")
        send = (
            "import json\nfrom tests.support.celery_app import work, soak_tasks\n"
            f"print(json.dumps({task}.apply_async(('lost', 0.1), queue='ride').id))\n"
        )
        task_id = produce(env, send)
        assert steal(broker, setup.queue)["headers"]["id"] == task_id  # type: ignore[index]
        if task == "work":
            # The duplicate is still refused: its hold stands, as the call is owed a run.
            assert produce(env, send) == task_id
        # A call received first: the server has the receipt's scripts by the time the
        # lost one comes back, so its take rides kombu's pipeline.
        produce(env, send.replace("('lost', 0.1)", "('first', 0.0)"))
        worker = Worker(env, queue=QUEUE).start()
        try:
            # Pushed again by a worker's sweep (this one's, or another test's worker's
            # sharing the broker).
            wait_for(lambda: checker.llen("runs") >= 2, 20, "both runs")
            wait_for(lambda: settled(broker, setup.queue, worker), 30, "no call left anywhere")
        finally:
            worker.stop()
        runs = [json.loads(raw) for raw in checker.lrange("runs", 0, -1)]
        assert [(run["id"], run["item"]) for run in runs if run["item"] == "lost"] == [
            (task_id, "lost")
        ]
        assert sorted(run["item"] for run in runs) == ["first", "lost"]
        assert holds(locks) == {}
        assert notes_of(broker, setup.queue) == 0
        assert not locks.keys("pre:*")  # kombu's key prefix is never put on a lock's key

    @pytest.mark.parametrize("shape", SHAPES)
    def test_received_calls_are_never_pushed_again(
        self, shared: RedisServer, cenv: CeleryEnv, shape: str
    ) -> None:
        setup = shaped(shape, shared, cenv, CSL_TRANSIT_TIMEOUT="0.5")
        env, broker = setup.env, setup.broker
        checker = cenv.checker_client()
        checker.delete("runs")
        worker = Worker(env, queue=QUEUE).start()
        try:
            produce(
                env,
                "from tests.support.celery_app import work\n"
                "for i in range(20):\n"
                "    work.apply_async((f'kept-{i}', 0.3), queue='ride')\n"
                "print('null')\n",
            )
            wait_for(lambda: checker.llen("runs") >= 20, 30, "every run")
            wait_for(lambda: settled(broker, QUEUE, worker), 30, "no call left anywhere")
        finally:
            worker.stop()
        runs = [json.loads(raw) for raw in checker.lrange("runs", 0, -1)]
        assert sorted(run["item"] for run in runs) == sorted(f"kept-{i}" for i in range(20))
        assert notes_of(broker, QUEUE) == 0  # every note cleared at receipt

    @pytest.mark.parametrize("shape", SHAPES)
    def test_a_purge_frees_the_keys_of_the_calls_it_threw_away(
        self, shared: RedisServer, cenv: CeleryEnv, shape: str
    ) -> None:
        setup = shaped(shape, shared, cenv, CSL_TRANSIT_TIMEOUT="0.5")
        env, broker = setup.env, setup.broker
        result = produce(
            env,
            "import json\nfrom tests.support.celery_app import app, work\n"
            "first = work.apply_async(('purged',), queue='ride').id\n"
            "purged = app.control.purge()\n"
            "again = work.apply_async(('purged',), queue='ride').id\n"
            "print(json.dumps([first, purged, again]))\n",
        )
        first, purged, again = result
        assert purged >= 1
        assert again != first  # accepted: the purged call no longer holds the key
        assert broker.llen(QUEUE) == 1
        assert notes_of(broker, QUEUE) == 1  # the new call's note alone


@pytest.mark.oneoff  # a Sentinel group of its own
class TestSentinel:
    def test_a_call_lost_in_transit_on_a_sentinel_broker_runs_once(self, cenv: CeleryEnv) -> None:
        group = SentinelGroup().start()
        try:
            master = group.server_on(group.master_port()).client()
            env = {
                **cenv.env,
                "CSL_BROKER_URL": group.url,
                "CSL_RESULT_URL": group.url,
                "CSL_LOCK_URL": "",  # the master, found through the sentinels
                "CSL_MASTER_NAME": group.MASTER_NAME,
                "CSL_QUEUE": QUEUE,
                "CSL_TRANSIT_TIMEOUT": "1",
            }
            checker = cenv.checker_client()
            checker.delete("runs")
            task_id = produce(
                env,
                "import json\nfrom tests.support.celery_app import work\n"
                "print(json.dumps(work.apply_async(('sentinel', 0.1), queue='ride').id))\n",
            )
            assert steal(master, QUEUE)["headers"]["id"] == task_id  # type: ignore[index]
            worker = Worker(env, queue=QUEUE).start()
            try:
                wait_for(lambda: checker.llen("runs") >= 1, 20, "the run")
                wait_for(lambda: settled(master, QUEUE, worker), 30, "no call left anywhere")
            finally:
                worker.stop()
            runs = [json.loads(raw) for raw in checker.lrange("runs", 0, -1)]
            assert [(run["id"], run["item"]) for run in runs] == [(task_id, "sentinel")]
            assert notes_of(master, QUEUE) == 0
        finally:
            group.cleanup()
