"""A lock's history (``history=True`` on the test's tasks, or ``singleton_lock_history``), read
with ``celery singleton history`` after real calls on a real worker: a refused call names
its holder, a contended run says what it did, and each other way a lock's story goes."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from celery_singleton_lock import IdempotencyConflictError
from celery_singleton_lock.lease import Lease
from celery_singleton_lock.tokens import RATE_SLOT_HEADER, queued_token, slot_header

from ..conftest import CeleryEnv
from ..support.cli import cli
from ..support.runs import UNTIL_OPENED, open_gate, started, wait_for
from ..support.workers import Worker


def story(cenv: CeleryEnv, task: Any, *args: Any) -> list[dict[str, str]]:
    """The lock's entries, oldest first, as ``celery singleton history --json`` gives them."""
    name = task.singleton_options().key.derive(args, {})
    done = cli(cenv, "history", name, "--json")
    assert done.returncode == 0, done.stderr
    entries: list[dict[str, str]] = json.loads(done.stdout)
    return entries[::-1]


def events(cenv: CeleryEnv, task: Any, *args: Any) -> list[str]:
    return [entry["event"] for entry in story(cenv, task, *args)]


class TestHistory:
    def test_a_refused_call_names_its_holder_and_the_run_starts_and_ends(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        task = cenv.app_module.chronicled
        first = task.apply_async(("h1", 1.0), queue=worker.queue)
        refused = task.apply_async(("h1", 1.0), queue=worker.queue)
        assert refused.id == first.id  # the duplicate gets the holder's result
        assert first.get(timeout=20) == "h1"
        wait_for(lambda: "released" in events(cenv, task, "h1"), 10, "the release recorded")
        entries = story(cenv, task, "h1")
        happened = [e["event"] for e in entries]
        # The worker may take the message before the second call is made, or after.
        assert happened[0] == "accepted"
        assert sorted(happened[1:3]) == ["refused", "started"]
        assert happened[3:] == ["released"]
        by_event = {e["event"]: e for e in entries}
        assert by_event["accepted"]["id"] == by_event["started"]["id"] == first.id
        refusal = by_event["refused"]
        assert refusal["holder"] in (f"{first.id} (queued)", f"{first.id} (running)")
        assert refusal["id"] != first.id  # the refused call's own
        assert all(e["task"] == task.name for e in entries)

    def test_every_refused_duplicate_is_recorded_even_one_answered_by_a_read(
        self, cenv: CeleryEnv, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        task = cenv.app_module.chronicled
        store = task.singleton_context.store
        reads: list[str] = []
        read = store.holder
        monkeypatch.setattr(
            store, "holder", lambda name, **entry: reads.append(name) or read(name, **entry)
        )
        calls = [task.apply_async(("h10",), queue="parked-history") for _ in range(4)]
        assert {c.id for c in calls} == {calls[0].id}
        assert reads  # a storm of duplicates is answered by the read, before a message
        entries = story(cenv, task, "h10")
        assert [e["event"] for e in entries] == ["accepted", "refused", "refused", "refused"]
        assert {e["holder"] for e in entries[1:]} == {f"{calls[0].id} (queued)"}
        assert len({e["id"] for e in entries}) == 4  # each refused call under its own id

    def test_a_contended_run_says_what_it_did(self, cenv: CeleryEnv, worker: Worker) -> None:
        task = cenv.app_module.chronicled_strict  # no dispatch check; contention fails
        first = task.apply_async(("h2", UNTIL_OPENED), queue=worker.queue)
        wait_for(lambda: any(s["id"] == first.id for s in started(cenv)), 20, "the first run")
        second = task.apply_async(("h2",), queue=worker.queue)
        second.get(timeout=20, propagate=False)
        open_gate(cenv, "h2")
        entries = story(cenv, task, "h2")
        [contended] = [e for e in entries if e["event"] == "contended"]
        assert contended["id"] == second.id
        assert contended["holder"] == f"{first.id} (running)"  # as the take's refusal read it
        assert contended["decision"] == "fail"
        first.get(timeout=20)

    @pytest.mark.parametrize("task_name", ["chronicled_patient", "chronicled_custom"])
    def test_a_run_that_waits_or_requeues_is_recorded_contending_once(
        self, cenv: CeleryEnv, worker: Worker, task_name: str
    ) -> None:
        # wait: the take meeting the holder writes the decision, the wait's own tries
        # nothing; a policy of the user's own: an entry of its own after each refusal.
        task = getattr(cenv.app_module, task_name)
        item = f"h11-{task_name}"
        first = task.apply_async((item, UNTIL_OPENED), queue=worker.queue)
        wait_for(lambda: any(s["id"] == first.id for s in started(cenv)), 20, "the first run")
        second = task.apply_async((item,), queue=worker.queue)
        wait_for(lambda: "contended" in events(cenv, task, item), 20, "the second contended")
        open_gate(cenv, item)
        assert [first.get(timeout=20), second.get(timeout=30)] == [item, item]
        wait_for(lambda: events(cenv, task, item).count("released") == 2, 10, "both releases")
        entries = story(cenv, task, item)
        contended = [e for e in entries if e["event"] == "contended"]
        assert {e["id"] for e in contended} == {second.id}
        assert all(e["holder"].startswith(first.id) for e in contended)
        if task_name == "chronicled_patient":
            assert [e["decision"] for e in contended] == ["wait up to 10s"]
        else:
            assert all(e["decision"].startswith("requeue in ") for e in contended)
        assert [e["id"] for e in entries if e["event"] == "started"] == [first.id, second.id]

    def test_a_replaced_call_and_an_operator_s_release(self, cenv: CeleryEnv) -> None:
        task = cenv.app_module.chronicled_latest
        first = task.apply_async(("h3", "v1"), queue="parked-history")
        assert task.apply_async(("h3", "v2"), queue="parked-history").id == first.id
        assert events(cenv, task, "h3", "v1") == ["accepted", "refused", "replaced"]
        name = task.singleton_options().key.derive(("h3", "v1"), {})
        done = cli(cenv, "release", name, "--force")
        assert done.returncode == 0, done.stderr
        last = story(cenv, task, "h3", "v1")[-1]
        assert last["event"] == "released by operator"
        assert last["by"].startswith("celery singleton, ")

    def test_a_late_slot_deferred_anew_is_recorded(self, cenv: CeleryEnv, worker: Worker) -> None:
        # A call carrying a slot a minute late (its worker was down, say) is deferred
        # anew behind the run that took the slot now: one more rate-limited entry, as a
        # hop's early slot (the same wait, sent on) records none.
        rated = cenv.app_module.chronicled_rated  # 1/2s
        first = rated.apply_async(("h6", 0), queue=worker.queue)
        assert first.get(timeout=20) == 0
        now = time.time()
        late = rated.apply_async(
            ("h6", 1),
            queue=worker.queue,
            headers={RATE_SLOT_HEADER: slot_header(now - 60, now - 61)},
        )
        assert late.get(timeout=20) == 1
        deferred = [e for e in story(cenv, rated, "h6") if e["event"] == "rate-limited"]
        assert [e["id"] for e in deferred] == [late.id]

    def test_a_rate_limited_run_and_a_cancelled_one(self, cenv: CeleryEnv, worker: Worker) -> None:
        rated = cenv.app_module.chronicled_rated
        calls = [rated.apply_async(("h4", n), queue=worker.queue) for n in range(2)]
        assert [c.get(timeout=20) for c in calls] == [0, 1]
        deferred = [e for e in story(cenv, rated, "h4") if e["event"] == "rate-limited"]
        assert deferred
        deferred_ids = {e["id"] for e in deferred}  # whichever of the two came second
        assert len(deferred_ids) == 1
        assert deferred_ids <= {c.id for c in calls}
        assert deferred[0]["detail"].startswith("runs at ")  # the slot, the server's clock
        cancel = cenv.app_module.chronicled_cancel
        running = cancel.apply_async(("h5", 10.0), queue=worker.queue)
        wait_for(lambda: "started" in events(cenv, cancel, "h5"), 20, "the run started")
        newest = cancel.apply_async(("h5", 0.0), queue=worker.queue)
        assert newest.get(timeout=30) == "h5"
        wait_for(lambda: "cancelled" in events(cenv, cancel, "h5"), 10, "the cancel recorded")
        [ended] = [e for e in story(cenv, cancel, "h5") if e["event"] == "cancelled"]
        assert ended["id"] == running.id

    def test_a_pending_call_s_run_starts_once(self, cenv: CeleryEnv, worker: Worker) -> None:
        task = cenv.app_module.chronicled_pending  # its hold beside the key, replaced
        assert task.apply_async(("h8", "v1"), queue=worker.queue).get(timeout=20) == "v1"
        wait_for(lambda: "released" in events(cenv, task, "h8", "v1"), 10, "the release")
        assert events(cenv, task, "h8", "v1") == ["accepted", "started", "released"]

    def test_each_of_n_runs_at_once_starts_and_ends(self, cenv: CeleryEnv, worker: Worker) -> None:
        task = cenv.app_module.chronicled_limited  # limit=2: each run takes a slot
        calls = [task.apply_async(("h9", 0.5), queue=worker.queue) for _ in range(2)]
        assert [c.get(timeout=20) for c in calls] == ["h9", "h9"]
        wait_for(lambda: events(cenv, task, "h9").count("released") == 2, 10, "both releases")
        entries = story(cenv, task, "h9")
        starts = {e["id"] for e in entries if e["event"] == "started"}
        assert starts == {c.id for c in calls}

    def test_nothing_is_kept_without_history_and_the_command_says_how(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        work = cenv.app_module.work
        assert work.apply_async(("h6",), queue=worker.queue).get(timeout=20) == "h6"
        name = work.singleton_options().key.derive(("h6",), {})
        assert not any(k.endswith(b":history") for k in cenv.lock_client().scan_iter("t:*"))
        done = cli(cenv, "history", name)
        assert done.returncode == 1
        assert "singleton_lock_history = True" in done.stderr

    def test_an_expired_hold_released_late_is_recorded_as_such(self, cenv: CeleryEnv) -> None:
        task = cenv.app_module.chronicled
        store = task.singleton_context.store
        name = task.singleton_options().key.derive(("h7",), {})
        assert isinstance(store.try_acquire(name, 0.05, token=queued_token("gone")), Lease)
        wait_for(lambda: store.holder(name) is None, 5, "the hold expired")
        row_token = queued_token("gone")
        record = task.singleton_context.record(
            name, "gone", release=("released", "lost", "expired")
        )
        store.release_token(name, row_token, entry=record)
        assert events(cenv, task, "h7") == ["expired"]


class TestIdempotencyInTheHistory:
    def test_repeats_conflicts_and_replays_are_recorded(
        self, cenv: CeleryEnv, worker: Worker
    ) -> None:
        task = cenv.app_module.charge_chronicled
        key = f"history-{time.time_ns()}"
        first = task.apply_async(("ih",), idempotency_key=key, queue=worker.queue)
        assert first.get(timeout=20) == "ih"
        assert task.apply_async(("ih",), idempotency_key=key, queue=worker.queue).id == first.id
        copy = task.app.send_task(
            task.name, ("ih",), headers={"singleton_lock_idempotency_key": key}, queue=worker.queue
        )
        assert copy.get(timeout=20) == "ih"
        wait_for(lambda: "idempotent replay" in events(cenv, task, "ih"), 10, "the replay")
        # The same key for other arguments: refused, and written in that call's lock.
        with pytest.raises(IdempotencyConflictError):
            task.apply_async(("ih-other",), idempotency_key=key, queue=worker.queue)
        [conflict] = story(cenv, task, "ih-other")
        assert conflict["event"] == "idempotency conflict"
        assert (conflict["idempotency_key"], conflict["id"]) == (key, first.id)
        entries = {entry["event"]: entry for entry in story(cenv, task, "ih")}
        assert entries["idempotent repeat"]["id"] == first.id
        assert entries["idempotent repeat"]["idempotency_key"] == key
        assert entries["idempotent replay"]["id"] == copy.id
        assert entries["idempotent replay"]["holder"] == first.id
