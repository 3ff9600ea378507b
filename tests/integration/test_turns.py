"""A task's waiting room for its ``total_limit`` (``lease.limits.turns``), on a real
redis-server: the freed slots handed out round robin by weight, the caps, a lost
reservation put back in front, a call's two messages told apart, a paused call's turn
given back; and when a worker's sweep of the rooms asks the store at all."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import redis

from celery_singleton_lock import RedisLock
from celery_singleton_lock.lease import Contended, Lease
from celery_singleton_lock.lease.limits import turns as turns_module
from celery_singleton_lock.lease.limits.turns import Kept, Turns, Waiter, turns_of

from ..support.servers import free_port

TOTAL = "task#total"


@pytest.fixture(name="turns")
def fixture_turns(raw: redis.Redis) -> tuple[RedisLock, Turns]:
    store = RedisLock(raw, prefix="tt")
    turns = turns_of(store)
    assert turns is not None
    return store, turns


def take(turns: Turns, key: str, ident: str, weight: float = 1.0, *, stamp: int = 0) -> object:
    waiter = Waiter(ident, f"msg-{ident}".encode(), weight, stamp)
    return turns.take(TOTAL, 2, key, waiter, widest=2, cap=None, token=f"x|{ident}", ttl=30).taken


def run_all(
    store: RedisLock,
    turns: Turns,
    running: list[tuple[str, tuple[Lease, Lease]]],
    weights: dict[str, float] | None = None,
) -> str:
    """End the runs one at a time, oldest first, each freed slot's call starting on its
    turn (of its key's weight, as every call of the key says it): the keys in the order
    they ran."""
    order = ""
    while running:
        _, (own, every) = running.pop(0)
        handed = turns.hand_out(TOTAL, 2, ending=every)
        store.release(own)  # (a run's end releases its key's slot after the total's)
        for call in handed:
            key = call.ident[0]
            weight = (weights or {}).get(key, 1.0)
            taken = take(turns, key, call.ident, weight, stamp=call.stamp)
            assert isinstance(taken, tuple), taken
            running.append((call.ident, taken))
            order += call.ident[0]
    return order


def test_a_late_key_is_served_next_and_then_in_turn(turns: tuple[RedisLock, Turns]) -> None:
    store, room = turns
    running = []
    for n in range(6):
        taken = take(room, "A", f"A{n}")
        if isinstance(taken, tuple):
            running.append((f"A{n}", taken))
        else:
            assert taken == Kept("A")
    assert len(running) == 2, "the total's two slots, then A's calls wait"
    for n in range(2):
        assert take(room, "B", f"B{n}") == Kept("B"), "a newcomer does not overtake the line"
    assert room.waiting(TOTAL) == {"A": 4, "B": 2}
    assert run_all(store, room, running) == "BABAAA"
    assert room.waiting(TOTAL) == {}
    assert room.with_calls() == []


def test_weights_share_the_turns(turns: tuple[RedisLock, Turns]) -> None:
    store, room = turns
    running = []
    for n in range(12):
        taken = take(room, "L", f"L{n}")
        if isinstance(taken, tuple):
            running.append((f"L{n}", taken))
    for n in range(12):
        assert isinstance(take(room, "H", f"H{n}", weight=3.0), Kept)
    # H starts waiting at the virtual time L's two runs reached: it is served first, then
    # three of H's for one of L's while both wait (a tie goes to the key named first).
    assert run_all(store, room, running, {"H": 3.0}) == "HHHHLHHHLHHHLHHLLLLLLL"


def test_a_lost_reservation_goes_back_in_front(
    turns: tuple[RedisLock, Turns], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, room = turns
    monkeypatch.setattr(turns_module, "RESERVE", 0.2)
    own, every = take(room, "A", "A0")  # type: ignore[misc]
    assert isinstance(take(room, "A", "A1"), tuple)
    for ident in ("A2", "A3"):
        assert isinstance(take(room, "A", ident), Kept)
    [handed] = room.hand_out(TOTAL, 2, ending=every)
    store.release(own)
    assert handed.ident == "A2"
    time.sleep(0.3)  # its message lost: its reservation runs out
    [again] = room.hand_out(TOTAL, 2)
    assert again.ident == "A2", "put back in front of its line, handed out again"
    assert room.waiting(TOTAL) == {"A": 2}


def test_a_call_runs_once_whichever_of_its_messages_comes(turns: tuple[RedisLock, Turns]) -> None:
    store, room = turns
    first = [take(room, "A", f"A{n}") for n in range(2)]
    assert isinstance(take(room, "A", "A2"), Kept)
    assert isinstance(take(room, "A", "A2"), Kept), "a redelivered copy is not kept twice"
    assert room.waiting(TOTAL) == {"A": 1}
    own, every = first[0]  # type: ignore[misc]
    [handed] = room.hand_out(TOTAL, 2, ending=every)
    store.release(own)
    # The message it was kept from comes again (its worker died before the ack) while
    # the call still waits: it claims the turn; the one sent on its turn is then a copy.
    assert isinstance(take(room, "A", handed.ident), tuple)
    assert take(room, "A", handed.ident, stamp=handed.stamp) == Kept("A", started=True)
    assert room.waiting(TOTAL) == {}


def test_a_paused_call_gives_its_turn_back(turns: tuple[RedisLock, Turns]) -> None:
    store, room = turns
    own, every = take(room, "A", "A0")  # type: ignore[misc]
    take(room, "A", "A1")
    assert isinstance(take(room, "B", "B0"), Kept)
    assert isinstance(take(room, "A", "A2"), Kept)
    [handed] = room.hand_out(TOTAL, 2, ending=every)
    store.release(own)
    assert handed.ident == "B0"
    assert room.give_back(TOTAL, 2, "B0"), "its key paused: it will not start now"
    [instead] = room.hand_out(TOTAL, 2)
    assert instead.ident == "A2"
    assert room.waiting(TOTAL) == {"A": 1}


def test_keys_that_no_longer_wait_are_forgotten(
    turns: tuple[RedisLock, Turns], raw: redis.Redis
) -> None:
    store, room = turns
    running = []
    for n in range(40):
        taken = take(room, f"K{n}", f"K{n}")
        if isinstance(taken, tuple):
            running.append((f"K{n}", taken))
    order = ""
    while running:
        _, (own, every) = running.pop(0)
        handed = room.hand_out(TOTAL, 2, ending=every)
        store.release(own)
        for call in handed:
            taken = room.take(
                TOTAL, 2, call.ident, Waiter(call.ident, b"m", 1.0, call.stamp),
                widest=2, cap=None, token=f"x|{call.ident}", ttl=30,
            ).taken  # fmt: skip
            assert isinstance(taken, tuple)
            running.append((call.ident, taken))
            order += "."
    assert len(order) == 38, "every key ran once"
    known = store.keys(TOTAL).lock + ":turns:keys"
    for _ in range(200):  # a sweep's hand-outs, with nothing to hand out
        room.hand_out(TOTAL, 2)
        if not raw.hlen(known):
            break
    assert raw.hlen(known) == 0, "the keys that waited once are forgotten"


def test_a_late_message_of_an_earlier_hand_out_is_a_copy(
    turns: tuple[RedisLock, Turns], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its first message sent on its turn seemed lost and was sent again; then both come
    # (kombu restored the first after its visibility timeout): one runs, whichever first.
    store, room = turns
    monkeypatch.setattr(turns_module, "RESERVE", 0.2)
    own, every = take(room, "A", "A0")  # type: ignore[misc]
    take(room, "A", "A1")
    assert isinstance(take(room, "A", "A2"), Kept)
    [first] = room.hand_out(TOTAL, 2, ending=every)
    store.release(own)
    time.sleep(0.3)  # its reservation runs out: put back, handed out again
    [second] = room.hand_out(TOTAL, 2)
    assert (first.ident, second.ident) == ("A2", "A2")
    assert second.stamp > first.stamp
    assert isinstance(take(room, "A", "A2", stamp=second.stamp), tuple)
    for stamp in (first.stamp, 0):  # late again, or the message it was kept from
        assert take(room, "A", "A2", stamp=stamp) == Kept("A", started=True)
    assert room.waiting(TOTAL) == {}


def test_a_message_slower_than_its_reservation_still_claims_the_call(
    turns: tuple[RedisLock, Turns], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The broker took longer than a reservation to deliver it: a later hand-out's
    # message is on its way, and the first that comes runs the call (no livelock).
    store, room = turns
    monkeypatch.setattr(turns_module, "RESERVE", 0.2)
    own, every = take(room, "A", "A0")  # type: ignore[misc]
    other_own, other_every = take(room, "A", "A1")  # type: ignore[misc]
    for ident in ("A2", "A3"):
        assert isinstance(take(room, "A", ident), Kept)
    [first] = room.hand_out(TOTAL, 2, ending=every)
    store.release(own)
    time.sleep(0.3)
    [second] = room.hand_out(TOTAL, 2)
    assert isinstance(take(room, "A", "A2", stamp=first.stamp), tuple)
    assert take(room, "A", "A2", stamp=second.stamp) == Kept("A", started=True)
    # Its reservation ran out and it is put back, not yet handed again: a slow message
    # of it claims all the same (the total's slot free).
    [third] = room.hand_out(TOTAL, 2, ending=other_every)
    store.release(other_own)
    assert third.ident == "A3"
    time.sleep(0.3)
    room.hand_out(TOTAL, 2)  # (put back, handed out again)
    assert isinstance(take(room, "A", "A3", stamp=third.stamp), tuple)
    assert room.waiting(TOTAL) == {}


def test_a_run_whose_worker_died_comes_again_once(turns: tuple[RedisLock, Turns]) -> None:
    # Its own message, delivered again (acks_late, its worker killed mid-run): while its
    # run's slot is held, the library's copy rule decides (contended by that run); once
    # the slot is gone, the call again, under the same stamp, to run once more.
    store, room = turns
    own, every = take(room, "A", "A0")  # type: ignore[misc]
    take(room, "A", "A1")
    assert isinstance(take(room, "A", "A2"), Kept)
    [handed] = room.hand_out(TOTAL, 2, ending=every)
    store.release(own)
    run_own, run_every = take(room, "A", "A2", stamp=handed.stamp)  # type: ignore[misc]
    held = take(room, "A", "A2", stamp=handed.stamp)
    assert isinstance(held, Contended), held
    assert held.holder == "x|A2"
    assert held.name in {run_own.name, run_every.name}
    assert room.waiting(TOTAL) == {}
    store.release(run_own)
    store.release(run_every)  # (its lease ran out: the run is gone)
    again = take(room, "A", "A2", stamp=handed.stamp)
    assert isinstance(again, tuple), "the call again, run once more (a slot free)"


def test_a_copy_gives_no_turn_back_and_the_call_comes_round_once(
    turns: tuple[RedisLock, Turns],
) -> None:
    store, room = turns
    own, every = take(room, "A", "A0")  # type: ignore[misc]
    take(room, "A", "A1")
    assert isinstance(take(room, "B", "B0"), Kept)
    [handed] = room.hand_out(TOTAL, 2, ending=every)
    store.release(own)
    assert not room.give_back(TOTAL, 2, "B0", 0), "the message it was kept from: a copy"
    assert room.give_back(TOTAL, 2, "B0", handed.stamp), "its key paused"
    assert room.waiting(TOTAL) == {}
    # Sent round with its stamp, it comes back after the resume as the call: kept; the
    # message it was kept from, delivered again, is still a copy.
    assert take(room, "B", "B0") == Kept("B", started=True)
    taken = take(room, "B", "B0", stamp=handed.stamp)
    assert isinstance(taken, tuple), "the total has a free slot: it runs"


def test_a_hand_out_finds_the_keys_with_room_among_thousands(
    turns: tuple[RedisLock, Turns], raw: redis.Redis
) -> None:
    store, room = turns

    def wait(key: str, stamp: int = 0) -> object:
        waiter = Waiter(f"{key}:c", b"m", 1.0, stamp)
        return room.take(TOTAL, 2, key, waiter, widest=1, cap=None, token=f"x|{key}", ttl=30)

    running = [wait(f"R{n}").taken for n in range(2)]  # type: ignore[attr-defined]
    keys = [f"K{n:04}" for n in range(3000)]
    for key in keys:
        assert wait(key).taken == Kept(key)  # type: ignore[attr-defined]
    with_room = {"K2990", "K2995"}
    held = raw.pipeline(transaction=False)
    for key in keys:
        if key not in with_room:  # at its limit: its one slot held by a run elsewhere
            held.set(f"{store.keys(key).lock}:slot1", f"x|other-{key}", px=30_000)
    held.execute()
    handed = []
    for own, every in running:
        handed += room.hand_out(TOTAL, 2, ending=every)
        store.release(own)
    assert [call.ident for call in handed] == ["K2990:c", "K2995:c"]
    assert sum(room.waiting(TOTAL).values()) == 3000, "a handed call waits until it starts"
    # A key ahead in line that has room again is served next.
    own, every = wait("K2990", handed[0].stamp).taken  # type: ignore[attr-defined]
    raw.delete(f"{store.keys('K0007').lock}:slot1")
    [then] = room.hand_out(TOTAL, 2, ending=every)
    assert then.ident == "K0007:c"
    # (every key was read once or less per hand-out: none with room was passed by)


def test_the_room_expires_once_nothing_waits(
    turns: tuple[RedisLock, Turns], raw: redis.Redis
) -> None:
    store, room = turns
    running = []
    for n in range(6):
        taken = take(room, "AB"[n % 2], f"{'AB'[n % 2]}{n}")
        if isinstance(taken, tuple):
            running.append((f"{n}", taken))
    tag = store.keys(TOTAL).lock
    assert all(raw.pttl(key) == -1 for key in raw.keys(f"{tag}:turns*")), "calls wait"
    assert run_all(store, room, running) == "ABAB"
    left = raw.keys(f"{tag}:turns*")
    assert left, "the stamps of the calls that ran are kept a while"
    assert all(0 < raw.pttl(key) <= turns_module.CLAIMED_KEPT * 1000 for key in left)


def test_a_limit_an_operator_lowers_reaches_the_hand_outs(turns: tuple[RedisLock, Turns]) -> None:
    store, room = turns
    take(room, "A", "A0")  # (runs on: A holds one of its slots)
    own, every = take(room, "B", "B0")  # type: ignore[misc]
    assert isinstance(take(room, "A", "A1"), Kept)
    assert isinstance(take(room, "B", "B1"), Kept)
    # A1's message comes again (its worker died before the ack) and reads A's limit
    # lowered to 1 (``limits set``): A, at it, has no room now.
    again = Waiter("A1", b"msg-A1")
    taken = room.take(TOTAL, 2, "A", again, widest=2, cap=1, token="x|A1", ttl=30).taken
    assert taken == Kept("A")
    [handed] = room.hand_out(TOTAL, 2, ending=every)
    store.release(own)
    assert handed.ident == "B1", "A's turn would start nothing while A is at its limit"


def test_a_turn_its_key_cannot_take_goes_on_and_the_call_stays_first_in_line(
    turns: tuple[RedisLock, Turns],
) -> None:
    store, room = turns
    take(room, "A", "A0")  # (runs on: A holds one of its slots)
    own, every = take(room, "B", "B0")  # type: ignore[misc]
    assert isinstance(take(room, "A", "A1"), Kept)
    assert isinstance(take(room, "B", "B1"), Kept)
    [handed] = room.hand_out(TOTAL, 2, ending=every)
    store.release(own)
    assert handed.ident == "A1"
    # Its message reads A's limit lowered to 1 meanwhile: its key's slot will not free.
    lowered = Waiter("A1", b"msg-A1", 1.0, handed.stamp)
    turn = room.take(TOTAL, 2, "A", lowered, widest=2, cap=1, token="x|A1", ttl=30)
    assert turn.taken is None, "its turn reserved, its key's slot not free"
    assert room.give_back(TOTAL, 2, "A1", handed.stamp, stays=True)
    [instead] = room.hand_out(TOTAL, 2)
    assert instead.ident == "B1", "the turn went on at once"
    assert room.waiting(TOTAL) == {"A": 1, "B": 1}, "A1 still waits, first in A's line"


def test_stamps_are_kept_past_the_broker_s_unacked_timeout(
    turns: tuple[RedisLock, Turns], raw: redis.Redis
) -> None:
    # A copy the broker hands out after its visibility timeout must still find the stamp.
    store, room = turns
    kept = turns_module.stamps_kept(7200.0)
    assert kept >= 7200.0 + turns_module.RESERVE
    assert turns_module.stamps_kept(None) == turns_module.CLAIMED_KEPT
    waiter = Waiter("A0", b"msg-A0", 1.0, 0, kept)
    taken = room.take(TOTAL, 2, "A", waiter, widest=2, cap=None, token="x|A0", ttl=30).taken
    assert isinstance(taken, tuple)
    left = store.keys(TOTAL).lock + ":turns:left"
    until = raw.zscore(left, "A0")
    assert until is not None
    assert until / 1000 - time.time() > 7200.0, "its stamp outlives the broker's timeout"
    assert raw.pttl(left) == -1 or raw.pttl(left) / 1000 > 7200.0, "and the room's keys too"


def test_a_call_never_claimed_is_given_up_after_a_few_sends(
    turns: tuple[RedisLock, Turns], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its message is never sent, or dropped where it comes (a worker without its task):
    # not handed out every 60 s forever.
    store, room = turns
    monkeypatch.setattr(turns_module, "RESERVE", 0.1)
    own, every = take(room, "A", "A0")  # type: ignore[misc]
    take(room, "A", "A1")
    assert isinstance(take(room, "B", "B0"), Kept)
    sends = room.hand_out(TOTAL, 2, ending=every)
    store.release(own)
    given_up = []
    deadline = time.monotonic() + 10
    while not given_up and time.monotonic() < deadline:
        time.sleep(0.12)  # its reservation runs out unclaimed
        handed = room.hand_out(TOTAL, 2)
        sends += [call for call in handed if not call.given_up]
        given_up = [call for call in handed if call.given_up]
    assert [call.ident for call in given_up] == ["B0"]
    assert given_up[0].record == b"msg-B0", "its message, to say which call it was"
    assert [call.ident for call in sends] == ["B0"] * 5, "sent five times, then given up"
    assert room.waiting(TOTAL) == {}
    assert room.with_calls() == []
    taken = take(room, "B", "B0", stamp=sends[-1].stamp)
    assert isinstance(taken, tuple), "a message of it that comes after all: a new call"


def test_a_worker_with_no_task_taking_turns_asks_the_store_nothing() -> None:
    """The waiting rooms' sweep asks the store only where one of the worker's tasks takes
    turns (found again as tasks are registered): the store is a closed port, so any
    question would raise. In an interpreter of its own: another test's shared tasks would
    be the app's too."""
    script = f"""
import pytest
from celery import Celery
from celery_singleton_lock import singleton_task
from celery_singleton_lock.broker.turn_sweep import TurnSweep
from celery_singleton_lock.exceptions import LockStoreUnavailableError

def echo(x):
    return x

app = Celery("no-turns", broker="memory://", set_as_current=False)
app.conf.singleton_lock_url = "redis://127.0.0.1:{free_port()}/0"
singleton_task(app=app, shared=False, name="t.plain")(echo)
sweep = TurnSweep.of(app)
assert sweep is not None
sweep()  # nothing asked
singleton_task(app=app, shared=False, name="t.fair", key=["x"], limit=1, total_limit=2)(echo)
with pytest.raises(LockStoreUnavailableError):
    sweep()  # a task taking turns: its rooms are asked for
"""
    ran = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
