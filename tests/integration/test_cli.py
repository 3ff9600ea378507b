"""``celery -A tests.support.celery_app singleton ...`` against real Redis and real workers holding
locks in every state: queued, reserved, running, throttled, limit slots, an orphan left
by a SIGKILLed worker, and holds left behind by a queue emptied behind kombu's back
(``celery purge`` gives its messages' holds up itself)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from celery_singleton_lock import MemoryLock
from celery_singleton_lock._time import human
from celery_singleton_lock.config.options import SingletonOptions
from celery_singleton_lock.contrib.locks import TaskNames, parse_duration, rows
from celery_singleton_lock.lease import LockKeys, Rate, companion, rates_of, slot
from celery_singleton_lock.lease.names import parse_key
from celery_singleton_lock.tokens import queued_token, read_token, running_token

from ..conftest import CeleryEnv
from ..support.cli import APP, cli
from ..support.runs import started, wait_for
from ..support.same_server import produce
from ..support.workers import ROOT, Worker


def listed(cenv: CeleryEnv, *args: str) -> list[dict[str, Any]]:
    done = cli(cenv, "list", "--json", *args)
    assert done.returncode == 0, done.stderr
    result: list[dict[str, Any]] = json.loads(done.stdout)
    return result


def by_task_id(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {entry["task_id"]: entry for entry in entries}


def throttled_for(options: SingletonOptions, window: float) -> SingletonOptions:
    """``options`` with their throttle window ``window`` seconds long."""
    return dataclasses.replace(options, own={**options.own, "throttle": window})


def wait_started(cenv: CeleryEnv, *items: str) -> None:
    wait_for(lambda: {r["item"] for r in started(cenv)} >= set(items), 20, f"{items} started")


@pytest.fixture(name="holding_worker")
def fixture_holding_worker(celery_env: CeleryEnv) -> Iterator[Worker]:
    """A worker with room for a running task, two slots of a limit and one more at once."""
    worker = Worker(celery_env.env, concurrency=4).start()
    try:
        yield worker
    finally:
        worker.kill()  # not a warm shutdown: that would wait for the long tasks


@pytest.fixture(name="victim")
def fixture_victim(celery_env: CeleryEnv) -> Iterator[Worker]:
    """A worker to SIGKILL: its leases last 60 s, so they are still there afterwards."""
    worker = Worker(celery_env.env, extra_env={"CSL_TTL": "60"}).start()
    try:
        yield worker
    finally:
        worker.kill()


@pytest.mark.slow
def test_every_state_is_listed_with_its_holder_and_explained(
    cenv: CeleryEnv, holding_worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = cenv.app_module
    queue = holding_worker.queue
    running = app.work.apply_async(("running", 30.0), queue=queue)
    # A mode that looks at the store when its run starts reserves a received message;
    # the default takes the running lease as the message arrives (under the main pid).
    reserved = app.latest_queued.apply_async(("reserved", "v1"), countdown=60, queue=queue)
    prefetched = app.work.apply_async(("prefetched",), countdown=60, queue=queue)
    queued = app.work.apply_async(("queued",), queue=f"parked-{uuid.uuid4().hex}")
    slots = [app.export.apply_async(("e", 30.0), queue=queue) for _ in range(2)]
    # A window longer than the test takes (the task's own is 1.5 s).
    options = throttled_for(app.throttled.singleton_options(), 60.0)
    monkeypatch.setattr(type(app.throttled), "_singleton_options", options)
    throttled = app.throttled.apply_async(("t",), queue=queue)
    wait_started(cenv, "running", "e", "t")
    wait_for(lambda: len([s for s in started(cenv) if s["item"] == "e"]) == 2, 20, "two slots")
    # Every child busy (the throttled run's child once it is done), and a message
    # prefetched behind them: held by the worker, not started.
    busy = app.work.apply_async(("busy", 30.0), queue=queue)
    wait_started(cenv, "busy")
    behind = app.work.apply_async(("behind",), queue=queue)
    wait_for(lambda: behind.id in by_task_id(listed(cenv, "--store-only")), 20, "its lease")

    entries = by_task_id(listed(cenv))
    assert running.id in entries, (running.id, entries)
    assert entries[running.id]["state"] == "running"
    assert entries[reserved.id]["state"] == "reserved"
    # Its worker holds the running lease (taken as the message arrived, under the main
    # pid) but has not started it: asked, the worker says it waits for its ETA.
    assert entries[prefetched.id]["state"] == "reserved"
    assert entries[behind.id]["state"] == "reserved"  # so is one behind busy children
    assert entries[busy.id]["state"] == "running"
    stored = by_task_id(listed(cenv, "--store-only"))
    assert stored[prefetched.id]["state"] == "running"
    assert stored[prefetched.id]["pid"] == holding_worker.pid
    assert stored[running.id]["pid"] == holding_worker.pid  # taken by its main process
    assert entries[queued.id]["state"] == "queued"
    assert entries[throttled.id]["state"] == "throttled"
    assert {entries[s.id]["role"] for s in slots} == {"slot1", "slot2"}
    assert {entries[s.id]["state"] for s in slots} == {"running"}
    assert len(entries) == 9  # the throttled task ran and freed its key: only its window
    run = entries[running.id]
    assert run["task"] == "tests.support.celery_app.work"
    assert run["worker"] == holding_worker.nodename
    # The run in progress names the pool child that runs it, as its worker says.
    [child] = {r["pid"] for r in started(cenv) if r["id"] == running.id}
    assert run["pid"] == child != holding_worker.pid
    assert run["fence"] > 0
    assert 0 <= run["age"] < 30
    assert 0 < run["ttl"] <= 10
    assert run["key"].startswith("t:{tests.support.celery_app.work:")
    assert entries[reserved.id]["worker"] == holding_worker.nodename
    assert entries[reserved.id]["pid"] is None
    assert entries[queued.id]["worker"] is None
    assert entries[queued.id]["ttl"] > 3000  # queue_ttl: the message waits in the broker
    assert set(run) == {"name", "key", "task", "task_id", "state", "worker", "pid", "age",
                        "ttl", "fence", "role"}  # fmt: skip

    assert set(by_task_id(listed(cenv, "--state", "running"))) == {
        running.id,
        busy.id,
        *(s.id for s in slots),
    }
    reserved_ids = {reserved.id, prefetched.id, behind.id}
    assert set(by_task_id(listed(cenv, "--state", "reserved"))) == reserved_ids
    assert set(by_task_id(listed(cenv, "--task", "tests.support.celery_app.export"))) == {
        s.id for s in slots
    }
    assert listed(cenv, "--older-than", "1h") == []
    aliased = cli(cenv, "ls", "--json")
    assert {e["task_id"] for e in json.loads(aliased.stdout)} == set(entries)
    assert len(listed(cenv, "--older-than", "0s")) == 9

    table = cli(cenv, "list", process=True)  # found through the celery.commands entry point
    assert table.returncode == 0
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["STATE", "AGE", "TTL"]
    assert lines[-1] == "9 lock(s): 1 queued, 3 reserved, 4 running, 1 throttled."

    shown = cli(cenv, "show", running.id)
    assert shown.returncode == 0, shown.stderr
    assert f"new call: refused: a duplicate of {running.id} (running); returns it" in shown.stdout
    assert f"holder alive: {holding_worker.nodename} has the task" in shown.stdout
    shown = cli(cenv, "show", prefetched.id)
    assert shown.returncode == 0, shown.stderr
    assert "has the task scheduled (waiting for its ETA)" in shown.stdout  # running, not started
    shown = cli(cenv, "show", behind.id)
    assert "has the task reserved" in shown.stdout  # prefetched behind busy children
    shown = cli(cenv, "show", throttled.id)
    assert "new call: refused for" in shown.stdout
    assert "holder cannot tell: a throttle window" in shown.stdout
    shown = cli(cenv, "show", slots[0].id, "--json")
    [lock] = [json.loads(line) for line in shown.stdout.splitlines()]
    assert lock["new_call"] == "accepted; runs at once (2 of 3 slots held)"
    assert {hold["task_id"] for hold in lock["holds"]} == {s.id for s in slots}
    assert all(hold["alive"] is True for hold in lock["holds"])
    # A Redis key names the lock as well as a task id does.
    assert cli(cenv, "show", entries[queued.id]["key"]).returncode == 0


def test_a_rate_shows_what_may_start_now_and_when_the_next_may(cenv: CeleryEnv) -> None:
    rated, planned = cenv.app_module.rated, cenv.app_module.planned
    store = rated.singleton_context.store
    name = rated.singleton_options().key.derive(("k",), {})
    for _ in range(4):  # 20/s: one now, three reserved 50 ms apart
        rates_of(store).ask(name, Rate(20, 1.0), "reserve")
    rates_of(store).ask(planned.singleton_options().key.derive(("gold",), {}), Rate(2, 1.0))
    rows = {r["task"]: r for r in listed(cenv, "--state", "limited")}
    assert set(rows) == {rated.name, planned.name}
    row = rows[rated.name]
    assert (row["state"], row["role"], row["task_id"], row["remaining"]) == (
        "limited",
        "rate",
        None,
        0,
    )
    assert 0 < row["next_slot"] <= 0.2
    assert row["key"].endswith(":rate")
    assert rows[planned.name]["remaining"] == 0  # a plan's rate is not known here, its burst is
    assert 0 < rows[planned.name]["next_slot"] <= 0.5
    table = cli(cenv, "list").stdout
    assert "may start now, next in" in table
    assert table.splitlines()[-1] == "2 lock(s): 2 limited."
    refused = cli(cenv, "release", row["key"])
    assert refused.returncode == 1
    assert "is a rate's schedule, not a lock" in refused.stderr
    # Nothing left once the slots passed.
    wait_for(lambda: listed(cenv, "--state", "limited") == [], 5, "the slots passed")


@pytest.mark.slow
def test_release_refuses_a_live_holder_and_frees_a_killed_workers_lease(
    cenv: CeleryEnv, holding_worker: Worker, victim: Worker
) -> None:
    app = cenv.app_module
    live = app.work.apply_async(("live", 30.0), queue=holding_worker.queue)
    doomed = app.work.apply_async(("doomed", 30.0), queue=victim.queue)
    wait_started(cenv, "live", "doomed")
    victim.kill()

    refused = cli(cenv, "release", live.id)
    assert refused.returncode == 1
    assert "is alive" in refused.stderr
    assert "--force" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert live.id in by_task_id(listed(cenv))

    freed = cli(cenv, "release", doomed.id)
    assert freed.returncode == 0, freed.stderr
    assert freed.stdout.startswith("released tests.support.celery_app.work:")
    assert doomed.id not in by_task_id(listed(cenv))
    # The key is free: the same call is accepted again at once.
    again = app.work.apply_async(("doomed",), queue=holding_worker.queue)
    assert again.id != doomed.id
    assert again.get(timeout=30) == "doomed"

    unknown = cli(cenv, "release", "no-such-lock")
    assert unknown.returncode == 1
    assert "no lock matches 'no-such-lock'" in unknown.stderr


def test_queued_messages_are_found_under_kombu_s_global_keyprefix(cenv: CeleryEnv) -> None:
    """kombu's ``global_keyprefix`` names every broker key: a queued call (any priority)
    is found in its prefixed list, never taken for an orphan and released."""
    queue, prefixed = f"parked-{uuid.uuid4().hex}", {"CSL_KEYPREFIX": "pre:"}
    queued = produce(
        {**cenv.env, **prefixed},
        "import json\nfrom tests.support.celery_app import work\n"
        f"print(json.dumps([work.apply_async((f'k{{p}}',), queue={queue!r}, priority=p).id "
        "for p in (0, 9)]))\n",
    )
    lists = cenv.broker.client().keys(f"pre:{queue}*")
    assert len(lists) == 2, lists  # the messages sit in kombu's prefixed lists
    found = json.loads(cli(cenv, "orphans", "--json", env=prefixed).stdout)
    assert not {e["task_id"] for e in found} & set(queued)


@pytest.mark.slow
def test_orphans_are_exactly_the_dropped_holds_and_the_killed_workers_lease(
    cenv: CeleryEnv, holding_worker: Worker, victim: Worker
) -> None:
    app = cenv.app_module
    parked, dropped, kept = (f"{q}-{uuid.uuid4().hex}" for q in ("parked", "dropped", "kept"))
    purged = [app.work.apply_async((f"p{i}",), queue=parked) for i in range(3)]
    # Sent without in-transit notes, so no worker's sweep pushes them again once their
    # queue is emptied behind kombu's back (as a redis-cli DEL would).
    lost = produce(
        {**cenv.env, "CSL_TRANSIT_TIMEOUT": "0"},
        "import json\nfrom tests.support.celery_app import work\n"
        f"print(json.dumps([work.apply_async((f'd{{i}}',), queue={dropped!r}).id "
        "for i in range(2)]))\n",
    )
    waiting = app.work.apply_async(("waiting",), queue=kept)
    live = app.work.apply_async(("live", 30.0), queue=holding_worker.queue)
    later = app.work.apply_async(("later",), countdown=60, queue=holding_worker.queue)
    doomed = app.work.apply_async(("doomed", 30.0), queue=victim.queue)
    wait_started(cenv, "live", "doomed")
    victim.kill()

    assert {e["task_id"] for e in json.loads(cli(cenv, "orphans", "--json").stdout)} == {
        doomed.id
    }  # the parked and dropped messages are still in their queues
    purge = subprocess.run(
        [sys.executable, "-m", "celery", "-A", APP, "purge", "-f", "-Q", parked],
        cwd=ROOT, env={**os.environ, **cenv.env}, capture_output=True, text=True, timeout=60,
        check=True,
    )  # fmt: skip
    assert "Purged 3 messages" in purge.stdout
    # The purge gave the purged calls' keys up itself: no orphans of theirs.
    assert not {p.id for p in purged} & set(by_task_id(listed(cenv)))
    cenv.broker.client().delete(dropped)

    found = json.loads(cli(cenv, "orphans", "--json").stdout)
    assert {e["task_id"] for e in found} == {doomed.id, *lost}
    why = {e["task_id"]: e["why"] for e in found}
    assert why[doomed.id] == f"worker {victim.nodename} does not answer a ping"
    assert why[lost[0]] == "its message is in no queue and no worker has it"

    freed = cli(cenv, "orphans", "--release")
    assert freed.returncode == 0, freed.stderr
    assert "released 3 of 3 orphaned lock(s)" in freed.stdout
    assert set(by_task_id(listed(cenv))) == {waiting.id, live.id, later.id}
    assert "No orphaned locks at redis://127.0.0.1:" in cli(cenv, "orphans").stdout


@pytest.mark.slow
def test_no_locks_an_unreachable_store_and_bad_input_say_so_plainly(cenv: CeleryEnv) -> None:
    empty = cli(cenv, "list")
    assert empty.returncode == 0
    assert empty.stdout.startswith("No locks at redis://127.0.0.1:")
    assert listed(cenv) == []
    down = cli(cenv, "list", env={"CSL_LOCK_URL": "redis://:hunter2@127.0.0.1:1/0"})
    assert down.returncode == 1
    assert "unreachable" in down.stderr
    assert "hunter2" not in down.stderr + down.stdout
    assert "Traceback" not in down.stderr
    bad = cli(cenv, "list", "--older-than", "soon")
    assert bad.returncode == 2
    assert "not a duration: 'soon'" in bad.stderr
    zero = cli(cenv, "list", "--batch", "0")
    assert zero.returncode == 2
    assert "--batch" in zero.stderr
    assert "0 is not in the range x>=1" in zero.stderr
    leaked = cli(cenv, "list", env={"CSL_LOCK_URL": "redis://127.0.0.1:x/0?password=hunter2"})
    assert leaked.returncode == 1
    assert "hunter2" not in leaked.stderr + leaked.stdout
    assert "password=***" in leaked.stderr
    helped = cli(cenv, "--help", process=True)
    assert "celery -A proj singleton orphans --release" in helped.stdout


@pytest.mark.slow
@pytest.mark.oneoff  # a scale test: 100,000 locks
@pytest.mark.load
def test_list_over_100000_locks_takes_bounded_round_trips_and_memory(cenv: CeleryEnv) -> None:
    def probe() -> tuple[dict[str, int], int]:
        # The store's reads alone (asking the workers goes through the broker, which
        # is this server too).
        done = cli(cenv, "list", "--json", "--store-only", probe=True)
        assert done.returncode == 0, done.stderr[-2000:]
        [line] = [x for x in done.stderr.splitlines() if x.startswith("probe:")]
        counts = dict(field.split("=") for field in line.split()[1:])
        return {k: int(v) for k, v in counts.items()}, done.stdout.count('"task_id"')

    baseline, _ = probe()
    client, count = cenv.lock_client(), 100_000
    for start in range(0, count, 10_000):
        pipe = client.pipeline(transaction=False)
        for n in range(start, start + 10_000):
            name = f"tests.support.celery_app.work:{n:064x}"
            pipe.set(LockKeys.build("t", name).lock, running_token(f"id{n}", "w@h", 1), px=600_000)
        pipe.execute()
    counts, shown = probe()
    print(
        f"\nlist of {count} locks: {counts['scans']} SCANs, {counts['scripts']} scripts and "
        f"{counts['pipelines']} pipelines ({counts['commands']} commands), "
        f"peak RSS {counts['maxrss_kib'] / 1024:.1f} MiB "
        f"(empty store: {baseline['maxrss_kib'] / 1024:.1f} MiB)"
    )
    assert shown == count
    reads = counts["pipelines"] + counts["scripts"]
    assert count // 1000 <= reads <= count // 1000 + 1  # one per batch of 1000
    assert counts["scans"] <= 2 * (count // 1000) + 10  # SCAN COUNT 1000 (a hint)
    assert counts["maxrss_kib"] - baseline["maxrss_kib"] < 40 * 1024  # streamed, not held


def test_show_and_release_read_a_named_lock_alone(cenv: CeleryEnv) -> None:
    """By a lock's name or key: one read of its holds, no pass over the store's other
    locks; by a task id: a pass to find it (a token is the only place it is written)."""
    client = cenv.lock_client()
    pipe = client.pipeline(transaction=False)
    names = [f"tests.support.celery_app.work:{n:064x}" for n in range(3000)]
    for n, name in enumerate(names):
        pipe.set(LockKeys.build("t", name).lock, running_token(f"id{n}", "w@h", 1), px=600_000)
    pipe.execute()

    def scans(*args: str) -> tuple[int, str]:
        done = cli(cenv, *args, probe=True)
        assert done.returncode == 0, done.stderr[-2000:]
        [line] = [x for x in done.stderr.splitlines() if x.startswith("probe:")]
        return int(dict(f.split("=") for f in line.split()[1:])["scans"]), done.stdout

    found, out = scans("show", names[7])
    assert found == 0
    assert "task id id7," in out
    found, out = scans("show", LockKeys.build("t", names[8]).lock, "--json")
    assert found == 0
    assert json.loads(out)["holds"][0]["task_id"] == "id8"
    found, out = scans("show", "id9")
    assert found > 0  # a task id: looked for
    assert names[9] in out
    found, _ = scans("release", names[10], "--force")
    assert found == 0
    assert client.exists(LockKeys.build("t", names[10]).lock) == 0


def test_a_refusal_logs_one_info_line_naming_the_holder_and_its_state(
    cenv: CeleryEnv, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, parked = cenv.app_module, f"parked-{uuid.uuid4().hex}"
    first = app.work.apply_async(("logged",), queue=parked)
    with caplog.at_level("INFO", logger="celery_singleton_lock"):
        again = app.work.apply_async(("logged",), queue=parked)
    assert again.id == first.id
    lock = app.work.singleton_options().key.derive(("logged",), {})
    assert [r.getMessage() for r in caplog.records if r.name.startswith("celery_singleton")] == [
        f"refused at dispatch: task=tests.support.celery_app.work lock={lock} holder={first.id} "
        "state=queued"
    ]
    assert {r.levelname for r in caplog.records} == {"INFO"}
    options = throttled_for(app.throttled.singleton_options(), 30.0)
    monkeypatch.setattr(type(app.throttled), "_singleton_options", options)
    accepted = app.throttled.apply_async(("w",), queue=parked)
    caplog.clear()
    with caplog.at_level("INFO", logger="celery_singleton_lock"):
        app.throttled.apply_async(("w",), queue=parked)
    assert f"holder={accepted.id} state=throttled" in caplog.text


# -- the pieces, without processes -----------------------------------------------------


@pytest.mark.parametrize(
    "name", ["plain", "request:42", "with space{and}braces*?", "ünïcode/%25", "a" * 300]
)
@pytest.mark.parametrize("role", [None, "pending", "throttle", "slot7"])
def test_a_key_gives_back_its_lock_name_and_role(name: str, role: str | None) -> None:
    full = name if role is None else companion(name, role)
    keys = LockKeys.build("p:x", full)
    assert parse_key("p:x", keys.lock) == (name, role)
    for bookkeeping in (keys.fence, keys.signal, keys.waiters, keys.replaced):
        assert parse_key("p:x", bookkeeping) is None
    assert parse_key("other", keys.lock) is None


def test_tokens_tell_state_worker_pid_and_age() -> None:
    before = time.time()
    queued = read_token(queued_token("abc"))
    assert (queued.state, queued.task_id, queued.worker, queued.pid) == (
        "queued",
        "abc",
        None,
        None,
    )
    assert queued.since is not None
    assert before - 0.01 <= queued.since <= time.time() + 0.01
    running = read_token(running_token("abc", "celery@h", 42))
    assert (running.state, running.worker, running.pid) == ("running", "celery@h", 42)
    assert read_token("q|0123456789ab|abc").since is None  # a nonce without its time
    assert read_token("a-foreign-token").state is None


def test_the_memory_store_lists_what_it_holds(cenv: CeleryEnv) -> None:
    store = MemoryLock(prefix="t")
    work = cenv.app_module.work
    name = work.singleton_options().key.derive(("m",), {})
    lease = store.try_acquire(name, 30, token=running_token("tid", "w@h", 7))
    store.slots.try_acquire("exp", 3, 30, token=running_token("s1", "w@h", 8))
    found = {row.task_id: row for row in rows(store.holdings(), TaskNames(cenv.app_module.app))}
    assert found["tid"].state == "running"
    assert found["tid"].task == "tests.support.celery_app.work"
    assert found["tid"].fence == lease.fence  # type: ignore[union-attr]
    assert found["s1"].role == "slot1"
    assert found["s1"].lock_name == slot("exp", 1)


def test_a_format_key_names_its_task_only_when_one_template_matches(cenv: CeleryEnv) -> None:
    names = TaskNames(cenv.app_module.app)
    # process_request and callback_request share "request:{request_idx}" on purpose.
    assert names.of("request:42") is None
    assert names.of("tests.support.celery_app.work:" + "0" * 64) == "tests.support.celery_app.work"
    assert names.of("tests.support.celery_app.work:short") is None


def test_durations_and_ages_read_and_print_as_operators_write_them() -> None:
    assert parse_duration("90") == 90
    assert parse_duration("90s") == 90
    assert parse_duration("5m") == 300
    assert parse_duration("1h30m") == 5400
    assert parse_duration("2d") == 172800
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("5 minutes")
    assert [human(s) for s in (None, 3.25, 42, 303, 7800, 270000)] == [
        "-", "3.2s", "42s", "5m03s", "2h10m", "3d03h",
    ]  # fmt: skip


INSPECTED_APP = """
from celery import Celery
from celery_singleton_lock import singleton_task

app = Celery("inspected", broker="{broker}")


@singleton_task
def job(x):
    return x
"""


def test_inspect_singleton_stats_is_known_with_the_plain_decorator(
    cenv: CeleryEnv, tmp_path: Any
) -> None:
    """A shared task's class is made at finalization, after `celery inspect` checks the
    command's name: the command is registered when the decorator runs."""
    # A database of its own: no worker of the other tests answers there.
    broker = cenv.broker.url.rpartition("/")[0] + "/7"
    (tmp_path / "inspected.py").write_text(INSPECTED_APP.format(broker=broker))
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "inspected", "inspect", "singleton_stats",
         "--timeout", "0.5"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert "No nodes replied" in output, output
    assert "Usage:" not in output
