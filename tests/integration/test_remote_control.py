"""A worker whose app rides answers Celery's remote control as a plain Celery worker does.

``celery inspect stats`` (and Flower, which polls it) is sent the worker's broker
connection's info: its transport is named by path there, never the app's own class,
which kombu cannot encode as JSON (the reply then never came).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from kombu.transport import get_transport_cls

from celery_singleton_lock.broker import RedisTransport

from ..conftest import CeleryEnv
from ..support.topologies import SentinelGroup
from ..support.workers import ROOT, Worker

# The ride's transport as the worker's ``stats`` names it: kombu resolves the path.
NAMED = "celery_singleton_lock.broker.transport:RedisTransport"


def test_a_riding_worker_answers_stats_with_its_broker_s_transport_named(worker: Worker) -> None:
    replies = worker.inspect("stats")  # each command answered, or it fails
    connection = replies["stats"]["broker"]
    assert connection["transport"] == NAMED  # it rides: kombu's would say "redis"
    assert get_transport_cls(NAMED) is RedisTransport
    assert "password" not in connection  # Celery's own: left out of the reply
    assert replies["stats"]["pid"] == worker.pid


def test_a_riding_worker_answers_conf_report_and_active_queues(worker: Worker) -> None:
    replies = worker.inspect("conf", "report", "active_queues")
    assert replies["conf"]["singleton_lock_ride_broker"] is True
    assert "celery_singleton_lock.broker.transport" in replies["report"]["ok"]
    assert [queue["name"] for queue in replies["active_queues"]] == [worker.queue]


def test_celery_inspect_stats_on_the_command_line_answers(worker: Worker) -> None:
    done = subprocess.run(
        [
            sys.executable, "-m", "celery", "-A", worker.app, "inspect", "stats",
            "-d", worker.nodename, "-t", "10", "--json",
        ],
        cwd=ROOT, env={**worker.env, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    replies = json.loads(done.stdout.strip().splitlines()[-1])
    assert replies[worker.nodename]["broker"]["transport"] == NAMED


@pytest.mark.oneoff  # a Sentinel group of its own
def test_a_riding_worker_on_a_sentinel_broker_answers_stats(cenv: CeleryEnv) -> None:
    group = SentinelGroup().start()
    try:
        env = {
            **cenv.env,
            "CSL_BROKER_URL": group.url,
            "CSL_RESULT_URL": group.url,
            "CSL_LOCK_URL": "",
            "CSL_MASTER_NAME": group.MASTER_NAME,
        }
        worker = Worker(env).start()
        try:
            replies = worker.inspect("stats")
        finally:
            worker.stop()
    finally:
        group.cleanup()
    named = replies["stats"]["broker"]["transport"]
    assert named == "celery_singleton_lock.broker.transport:SentinelTransport"
