"""The broker ride on kombu releases it was not tested on: it does not install, says so
once per process, and nothing is lost or run twice, with producers and workers faked to
report such a release (each alone or both: a fleet mid-upgrade). On a kombu whose queue
naming changed, the ride follows kombu's own naming; on one whose unacked bookkeeping
changed, the worker's self-check turns the ride off, saying what differed."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from ..conftest import CeleryEnv
from ..support.modes import held
from ..support.runs import runs, wait_for
from ..support.workers import ROOT, Worker

WARNING = "is outside the releases the broker ride is tested on"

# Loaded by every Python process started with its folder first on PYTHONPATH, before
# anything else imports kombu: this process reports kombu 5.99.0 (outside the range),
# names its priority queues with another separator, or keeps its unacked messages in
# another hash than the channel names (what the transit sweep and the orphan check read).
FAKES = {
    "release": """
import kombu
kombu.__version__ = "5.99.0"
""",
    "queue naming": """
from kombu.transport import redis
redis.Channel.sep = "\\x07\\x17"
""",
    "unacked layout": """
from kombu.transport import redis
redis.QoS.unacked_key = property(lambda self: "unacked.v2")
""",
    # A release whose QoS records a received message with its commands the other way
    # round and one more: the ride's one script a step knows neither shape.
    "unacked chain": """
import time
from kombu.transport import redis, virtual
from kombu.utils.json import dumps
def append(self, message, delivery_tag):
    delivery = message.delivery_info
    value = dumps([message._raw, delivery["exchange"], delivery["routing_key"]])
    with self.pipe_or_acquire() as pipe:
        pipe.hset(self.unacked_key, delivery_tag, value).zadd(
            self.unacked_index_key, {delivery_tag: time.time()}
        ).incr("unacked.appended").execute()
        virtual.QoS.append(self, message, delivery_tag)
redis.QoS.append = append
""",
}

SELF_CHECK = "the broker ride is off in this worker: kombu's unacked bookkeeping is not a hash"

# A producer process: 12 keys dispatched twice each, over kombu's priority queues (0, 3,
# 6, 9: every list a separator names), then every accepted result read.
PRODUCE = """
import json, sys
from tests.support import celery_app
from celery_singleton_lock import broker
app, work, queue = celery_app.app, celery_app.work, sys.argv[1]
ids = [
    work.apply_async((f"v{n}", 0.05), queue=queue, priority=n % 4 * 3).id
    for n in range(12) for _ in range(2)
]
with app.connection_for_write() as connection:
    transport = connection.get_transport_cls().__module__
results = [work.AsyncResult(i).get(timeout=30) for i in sorted(set(ids))]
print(json.dumps({"ids": ids, "installed": broker.installed(app), "transport": transport}))
"""


def faked(tmp_path: Path, fake: str) -> dict[str, str]:
    folder = tmp_path / fake.replace(" ", "-")
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(FAKES[fake])
    return {"PYTHONPATH": f"{folder}:{ROOT}"}


def produce(cenv: CeleryEnv, queue: str, extra: dict[str, str]) -> tuple[dict[str, object], str]:
    done = subprocess.run(
        [sys.executable, "-c", PRODUCE, queue], cwd=ROOT, env={**cenv.env, **extra},
        capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


def assert_each_key_ran_once(cenv: CeleryEnv) -> None:
    wait_for(lambda: len(runs(cenv)) >= 12, 30, "12 runs")
    counts = Counter(run["item"] for run in runs(cenv))
    assert counts == {f"v{n}": 1 for n in range(12)}
    wait_for(lambda: not held(cenv), 10, "every lock released")


@pytest.mark.parametrize("outside", ["producer", "worker", "both"])
def test_outside_the_tested_releases_nothing_rides_and_nothing_is_lost_or_run_twice(
    cenv: CeleryEnv, tmp_path: Path, outside: str
) -> None:
    fake = faked(tmp_path, "release")
    worker = Worker(cenv.env, extra_env=fake if outside != "producer" else {}).start()
    try:
        produced, said = produce(cenv, worker.queue, fake if outside != "worker" else {})
        assert_each_key_ran_once(cenv)
        ids = produced["ids"]
        assert isinstance(ids, list)
        assert sorted(Counter(ids).values()) == [2] * 12, "each duplicate got the first's id"
        faked_producer = outside != "worker"
        assert produced["installed"] is not faked_producer
        assert produced["transport"] == (
            "kombu.transport.redis" if faked_producer else "celery_singleton_lock.broker.transport"
        )
        assert said.count(WARNING) == (1 if faked_producer else 0)
        log = worker.output()
        assert log.count(WARNING) == (1 if outside != "producer" else 0), log[-3000:]
    finally:
        worker.stop()


def test_a_changed_queue_naming_is_followed_by_the_ride(cenv: CeleryEnv, tmp_path: Path) -> None:
    fake = faked(tmp_path, "queue naming")
    worker = Worker(cenv.env, extra_env=fake).start()
    try:
        produced, said = produce(cenv, worker.queue, fake)
        assert produced["installed"] is True
        assert WARNING not in said
        assert_each_key_ran_once(cenv)
    finally:
        worker.stop()


def test_a_worker_whose_kombu_reads_otherwise_turns_the_ride_off(
    cenv: CeleryEnv, tmp_path: Path
) -> None:
    worker = Worker(cenv.env, extra_env=faked(tmp_path, "unacked layout")).start()
    try:
        wait_for(lambda: SELF_CHECK in worker.output(), 10, "the self-check's ERROR")
        produced, _ = produce(cenv, worker.queue, {})  # a producer that rides
        assert produced["installed"] is True
        assert_each_key_ran_once(cenv)
        log = worker.output()
        assert log.count(SELF_CHECK) == 1, log[-3000:]
        assert "ERROR" in log.split(SELF_CHECK)[0].splitlines()[-1]
    finally:
        worker.stop()


def test_a_kombu_that_records_otherwise_has_its_own_commands_sent_and_nothing_is_lost(
    cenv: CeleryEnv, tmp_path: Path
) -> None:
    broker = cenv.broker.client()
    broker.delete("unacked.appended")
    worker = Worker(cenv.env, extra_env=faked(tmp_path, "unacked chain")).start()
    try:
        produced, _ = produce(cenv, worker.queue, {})
        assert produced["installed"] is True
        assert_each_key_ran_once(cenv)
        assert "the broker ride is off" not in worker.output()
    finally:
        worker.stop()
    # Every message it received was recorded by kombu's own commands, the odd one too.
    assert int(broker.get("unacked.appended") or 0) >= 12
    left = [json.loads(v)[0]["headers"]["id"] for v in broker.hvals("unacked")]
    assert set(left).isdisjoint(produced["ids"])  # each removed once acked


def test_a_worker_whose_kombu_agrees_keeps_the_ride_and_its_probe_leaves_nothing(
    cenv: CeleryEnv, tmp_path: Path
) -> None:
    worker = Worker(cenv.env).start()
    try:
        passed = "the broker ride's self-check passed"
        wait_for(lambda: passed in worker.output(), 10, "the self-check")
        assert "the broker ride is off" not in worker.output()
    finally:
        worker.stop()
    broker = cenv.broker.client()
    assert broker.keys("*probe*") == []
    notes = [json.loads(v)[0] for v in broker.hvals("t:transit")]  # [hold's name, ...]
    assert "probe" not in notes
    assert not [f for f in broker.hkeys("t:transit:seq") if b"probe" in f]
