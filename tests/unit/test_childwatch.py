"""The main process's watch of its pool children: a request Celery has let go of (a
terminate) is released as its child dies, and forgotten when the child lives on."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from celery_singleton_lock.worker.childwatch import ChildWatch


class Stopped:
    """A request stopped by a signal: records that its dead child's holds were released."""

    def __init__(self) -> None:
        self.released = threading.Event()

    def release_for_dead_child(self, *, kill: bool) -> None:
        assert kill is False  # the child is dead already: nothing to kill
        self.released.set()


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    yield process
    process.kill()
    process.wait(timeout=10)


@pytest.fixture
def watch() -> ChildWatch:
    watch = ChildWatch()
    watch.enabled = True
    return watch


def test_a_request_let_go_is_released_as_its_child_dies(
    watch: ChildWatch, child: subprocess.Popen[bytes]
) -> None:
    watch.watch(child.pid)
    stopped = Stopped()
    watch.let_go(child.pid, stopped)
    assert not stopped.released.wait(0.2)  # the child still runs: nothing released
    child.kill()
    assert stopped.released.wait(10)
    assert watch.watched() == 0


def test_a_child_that_dies_before_it_is_let_go_still_releases(
    watch: ChildWatch, child: subprocess.Popen[bytes]
) -> None:
    child.kill()
    child.wait(timeout=10)  # reaped, as billiard may have done before Celery let go
    stopped = Stopped()
    watch.let_go(child.pid, stopped)
    assert stopped.released.wait(10)


def test_a_child_that_takes_another_task_forgets_the_one_let_go(
    watch: ChildWatch, child: subprocess.Popen[bytes]
) -> None:
    earlier, later = Stopped(), Stopped()
    watch.let_go(child.pid, earlier)
    watch.watch(child.pid)  # it survived the signal (a handled one) and runs the next task
    watch.let_go(child.pid, later)  # which is stopped in turn
    child.kill()
    assert later.released.wait(10)
    # Released in the order let go, in one pass: the earlier one would be set by now.
    assert not earlier.released.is_set()


def test_nothing_is_kept_where_tasks_do_not_run_in_children(child: subprocess.Popen[bytes]) -> None:
    watch = ChildWatch()  # a threads, gevent, eventlet or solo pool: not enabled
    stopped = Stopped()
    watch.let_go(child.pid, stopped)
    assert watch.watched() == 0
