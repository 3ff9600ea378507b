"""Plain Celery, celery-singleton 0.3.1, celery-once 3.0.1 and this project, side by side.

    python3 scripts/dev.py bench [--config default separate rabbitmq] [--rounds 5]

Three configurations, each in a process of its own: ``default`` (one redis-server: the
broker in db 0, results stored in db 1, where every system puts its locks by default),
``separate`` (broker and a dedicated lock server, results ignored) and ``rabbitmq`` (a
RabbitMQ broker; locks and results stored on a redis-server). Plain Celery and the
incumbents run in an app of their own, with kombu's and Celery's own classes, and their
own workers (``bench_app``); the dispatch sections (1 and 2) run each system in a
process of its own that imports it alone, as its users run it, against plain Celery
alone in its own (``alone``). Interleaves the systems in every round, repeats, and
reports medians and ratios against plain Celery measured in the same run. Writes
benchmarks/results.json and docs/benchmarks.md. Numbers are only what the run measured;
machines are noisy, so read ratios, not absolute times.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis
from celery import chain, chord
from kombu.connection import Connection

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import alone  # noqa: E402  (after the path is set)
from benchmarks.charts import grouped_bars  # noqa: E402
from benchmarks.targets import INCUMBENTS, checks, left  # noqa: E402
from tests.support.rabbitmq import RabbitMQServer, rabbitmq_available  # noqa: E402
from tests.support.servers import RedisServer  # noqa: E402
from tests.support.workers import Worker  # noqa: E402

ALL = ("plain", *INCUMBENTS, "this")
# The dispatch tables' control, every ratio's denominator: plain Celery alone in its
# process (one app, one task, nothing else imported).
CONTROL = "plain_alone"
# The dispatch tables' rows, each system in a process of its own (``alone``): the
# control, every system (plain: in the bench app's process, every system beside it), and
# this project called with idempotency keys.
# hold_floor: plain Celery with the least a hold can add on its own publish path (a key
# digest and one script that checks, pushes and holds; ``alone.hold_floor``), a control
# for unique calls only: its duplicate builds the message first.
FLOOR = "hold_floor"
DISPATCHED = (CONTROL, *ALL, "this_idempotent", FLOOR)
# this_events_on and this_no_receivers: what a refused call's Celery events cost, on (a
# producer with task_send_sent_event) and off (against none of their receivers connected);
# this_again: ``this`` in another process, the spread that difference is read against.
# For duplicates only: an accepted call sends none.
EVENTS_ROWS = ("this_events_on", "this_no_receivers", "this_again")
DUPLICATED = (*(system for system in DISPATCHED if system != FLOOR), *EVENTS_ROWS)
CHILDREN = (*DISPATCHED, *EVENTS_ROWS)
# Calls each dispatching process makes, unique and then repeated, before the clock runs:
# its connections, scripts and first calls' paths are a new process's, not a user's.
WARM = 50
# This project's lock modes (docs/modes.md); "this" is the default, until_executed.
MODES = (
    "plain",
    "this",
    "this_until_executing",
    "this_throttle",
    "this_replace",
    "this_debounce",
    "this_while_executing",
    "this_limit",
    "this_rate",
    "this_rate_delay",
    "this_cancel",
    "this_history",
)
# Fair shares across keys (section 12): first come, first served (the ratios' control)
# and round robin.
FAIR = ("this_fair_first", "this_fair")
# A rate-limited run's start: one limit, and two limits with a cost (section 9).
RATED = ("plain", "this_rate", "this_rates")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def paired_ratio(values: list[float], plain: list[float]) -> float:
    """Median of the round-by-round ratios to plain Celery: each pair ran side by side."""
    return round(median([v / p for v, p in zip(values, plain, strict=True)]), 2)


def paired_range(values: list[float], plain: list[float]) -> list[float]:
    """The lowest and highest of the round-by-round ratios to plain Celery: the spread
    the figures draw around the median."""
    ratios = [v / p for v, p in zip(values, plain, strict=True)]
    return [round(min(ratios), 2), round(max(ratios), 2)] if ratios else []


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


CONFIGS = {
    "default": "locks on the broker's Redis (the result backend's database), results stored",
    "separate": "a separate lock server, results ignored",
    "rabbitmq": "a RabbitMQ broker; locks on the result backend's Redis, results stored",
}


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.broker = RedisServer().start()
        base = self.broker.url.rsplit("/", 1)[0]
        self.rabbitmq: RabbitMQServer | None = None
        if args.config == "rabbitmq":
            # The messages on RabbitMQ; the redis-server has the locks and results (db 1)
            # and the runs' marks (db 0).
            self.rabbitmq = RabbitMQServer().start()
            self.locks = self.broker
            self.env = {
                "BENCH_BROKER_URL": self.rabbitmq.url,
                "BENCH_RESULT_URL": f"{base}/1",
                "BENCH_MARKS_URL": f"{base}/0",
                "BENCH_LOCK_URL": "",
                "BENCH_RESULTS": "1",
            }
            self.lr = redis.Redis.from_url(f"{base}/1")
        elif args.config == "default":
            self.locks = self.broker
            self.env = {
                "BENCH_BROKER_URL": f"{base}/0",
                "BENCH_RESULT_URL": f"{base}/1",
                "BENCH_LOCK_URL": "",
                "BENCH_RESULTS": "1",
            }
            self.lr = redis.Redis.from_url(f"{base}/1")
        else:
            self.locks = RedisServer().start()
            self.env = {"BENCH_BROKER_URL": f"{base}/0", "BENCH_LOCK_URL": self.locks.url}
            self.lr = self.locks.client()
        self.env["BENCH_TTL"] = "30"
        os.environ.update(self.env)
        import benchmarks.bench_app as bench  # noqa: PLC0415  (after the environment)

        self.bench = bench
        self.r = self.broker.client()
        self.results: dict[str, Any] = {}
        self.rng = random.Random(1)

    def close(self) -> None:
        self.broker.cleanup()
        if self.locks is not self.broker:
            self.locks.cleanup()
        if self.rabbitmq is not None:
            self.rabbitmq.cleanup()

    def worker(self, side: str, queue: str, concurrency: int = 2) -> Worker:
        """A worker of ``side``'s app (``bench_app.side``) on ``queue``, not started."""
        app = self.bench.app_path(side)
        return Worker(self.env, concurrency=concurrency, app=app, queue=queue)

    def workers(self, queue: str, concurrency: int = 2) -> dict[str, Worker]:
        """A started worker of each app, each on ``queue`` and its app's name."""
        found: dict[str, Worker] = {}
        try:
            for side in self.bench.APPS:
                found[side] = self.worker(side, f"{queue}-{side}", concurrency).start()
        except BaseException:
            for worker in found.values():
                worker.stop()
            raise
        return found

    def queued(self, queue: str) -> int:
        """Messages waiting in ``queue`` on the broker."""
        if self.rabbitmq is None:
            return int(self.r.llen(queue))
        with Connection(self.env["BENCH_BROKER_URL"]) as connection:
            channel = connection.default_channel
            return int(channel.queue_declare(queue, passive=True).message_count)

    def purge(self, queue: str) -> None:
        if self.rabbitmq is None:
            self.r.delete(queue)
            return
        # A connection of its own: a purge of a queue not declared yet closes its channel.
        connection = Connection(self.env["BENCH_BROKER_URL"])
        with connection, contextlib.suppress(*connection.channel_errors):
            connection.default_channel.queue_purge(queue)

    def order(self, systems: tuple[str, ...] = ALL) -> list[str]:
        shuffled = list(systems)
        self.rng.shuffle(shuffled)
        return shuffled

    def reset(self, *queues: str) -> None:
        self.lr.flushdb()  # the locks (and, by default, the results): never the queues
        for key in self.r.scan_iter("marks:*"):
            self.r.delete(key)
        for key in self.r.scan_iter("started:*"):
            self.r.delete(key)
        for queue in queues:
            self.purge(queue)

    # -- 1 and 2: dispatch ---------------------------------------------------------------

    def dispatch(self) -> None:
        # Each system dispatches in a process of its own, as its users run it (``alone``),
        # started afresh every round. Every round sends them their calls in slices, in a
        # fresh order each slice, so a drift of the machine's speed falls on all alike;
        # the ratios are to plain Celery alone in the same rounds.
        n, queue, slices = self.args.dispatches, "bench-dispatch", 8
        size = max(1, n // slices)
        unique: dict[str, list[float]] = {s: [] for s in DISPATCHED}
        duplicate: dict[str, list[float]] = {s: [] for s in DUPLICATED}
        published: dict[str, int] = {}
        for round_no in range(self.args.rounds):
            round_unique, round_duplicate = self._alone_round(round_no, queue, size, slices)
            for system in DISPATCHED:
                unique[system].append(round_unique[system])
            for system in DUPLICATED:
                duplicate[system].append(round_duplicate[system][0])
                published[system] = round_duplicate[system][1]
        self.reset(queue, *(f"{queue}-{system}" for system in DISPATCHED))
        self.results["dispatch_unique"] = {
            s: {
                "us_per_call": round(median(unique[s]), 1),
                "ratio": paired_ratio(unique[s], unique[CONTROL]),
                "ratio_range": paired_range(unique[s], unique[CONTROL]),
            }
            for s in DISPATCHED
        }
        self.results["dispatch_duplicate"] = {
            s: {
                "us_per_call": round(median(duplicate[s]), 1),
                "ratio_to_plain_delay": paired_ratio(duplicate[s], duplicate[CONTROL]),
                "ratio_to_plain_delay_range": paired_range(duplicate[s], duplicate[CONTROL]),
                "messages_published": published[s],
            }
            for s in DUPLICATED
        }

    def _alone_round(
        self, round_no: int, queue: str, size: int, slices: int
    ) -> tuple[dict[str, float], dict[str, tuple[float, int]]]:
        """One round of section 1 and 2, each system in a process of its own: microseconds
        per unique dispatch, per duplicate, and the messages each duplicate's queue got."""
        self.reset(queue)
        queues = {system: f"{queue}-{system}" for system in CHILDREN}
        # Each system's arguments: this project's rows call the same task.
        tags = {system: f"{round_no}-{number}" for number, system in enumerate(CHILDREN)}
        with alone.started(CHILDREN) as children:
            for system, child in children.items():
                child.calls(queue, f"warm-{tags[system]}", WARM)
                child.calls(queue, f"warm-{tags[system]}", WARM, same=True)

            def unique_slice(system: str, slice_no: int) -> float:
                return children[system].calls(queue, f"u-{tags[system]}-{slice_no}", size)

            unique = self._sliced(DISPATCHED, slices, unique_slice)
            self.reset(*queues.values())
            for system in DUPLICATED:  # the call the others duplicate
                children[system].calls(queues[system], f"dup-{tags[system]}", 1, same=True)

            def duplicate_slice(system: str, slice_no: int) -> float:
                args = f"dup-{tags[system]}"
                return children[system].calls(queues[system], args, size, same=True)

            duplicate = self._sliced(DUPLICATED, slices, duplicate_slice)
        calls = size * slices
        return (
            {s: unique[s] / calls * 1e6 for s in DISPATCHED},
            {s: (duplicate[s] / calls * 1e6, self.queued(queues[s])) for s in DUPLICATED},
        )

    def _sliced(
        self, systems: tuple[str, ...], slices: int, run: Callable[[str, int], float]
    ) -> dict[str, float]:
        """Seconds each system's ``run(system, slice)`` took, summed over ``slices``: the
        systems in a fresh order every slice, so a drift of the machine's speed falls on
        all of them alike."""
        spent = dict.fromkeys(systems, 0.0)
        for slice_no in range(slices):
            for system in self.order(systems):
                spent[system] += run(system, slice_no)
        return spent

    def _in_process(
        self,
        systems: tuple[str, ...],
        size: int,
        slices: int,
        call: Callable[[str, int, int], None],
    ) -> list[tuple[str, float]]:
        """Microseconds per ``call(system, slice, i)`` of each system, in this process:
        ``size`` calls a slice, in ``_sliced``'s order."""

        def run(system: str, slice_no: int) -> float:
            began = time.perf_counter()
            for i in range(size):
                call(system, slice_no, i)
            return time.perf_counter() - began

        spent = self._sliced(systems, slices, run)
        return [(s, spent[s] / (size * slices) * 1e6) for s in systems]

    def _unique_round(
        self, systems: tuple[str, ...], tag: str, queue: str, size: int, slices: int
    ) -> list[tuple[str, float]]:
        """Microseconds per unique dispatch of each system, interleaved in slices."""

        def call(system: str, slice_no: int, i: int) -> None:
            self.bench.SYSTEMS[system].apply_async((f"{tag}-{slice_no}-{i}",), queue=queue)

        return self._in_process(systems, size, slices, call)

    def _duplicate_round(
        self, systems: tuple[str, ...], queue: str, size: int, slices: int
    ) -> list[tuple[str, tuple[float, int]]]:
        """Microseconds per duplicate dispatch of each system (plain Celery's: a `delay()`
        with the same arguments, which it publishes), interleaved in slices as the unique
        dispatches are, and how many messages reached each system's own queue."""
        queues = {system: f"{queue}-{system}" for system in systems}
        self.reset(*queues.values())
        # Each system's own arguments: this project's rows call the same task.
        calls = {system: (f"dup-{system}",) for system in systems}
        for system in systems:  # the call the others duplicate
            self.bench.SYSTEMS[system].apply_async(calls[system], queue=queues[system])

        def call(system: str, slice_no: int, i: int) -> None:
            self.bench.SYSTEMS[system].apply_async(calls[system], queue=queues[system])

        timed = self._in_process(systems, size, slices, call)
        return [(s, (us, self.queued(queues[s]))) for s, us in timed]

    # -- 7: the lock modes ---------------------------------------------------------------

    def modes(self) -> None:
        n, queue, slices = self.args.dispatches, "bench-modes", 8
        size = max(1, n // slices)
        unique: dict[str, list[float]] = {s: [] for s in MODES}
        duplicate: dict[str, list[float]] = {s: [] for s in MODES}
        published: dict[str, int] = {}
        for round_no in range(self.args.rounds):
            self.reset(queue)
            for system in MODES:
                self.bench.SYSTEMS[system].apply_async((f"warm-{round_no}",), queue=queue)
            for system, us in self._unique_round(MODES, f"m-{round_no}", queue, size, slices):
                unique[system].append(us)
            for system, (us, sent) in self._duplicate_round(MODES, queue, size, slices):
                duplicate[system].append(us)
                published[system] = sent
        trips: dict[str, float] = {}
        for system in MODES:
            self.reset(queue)
            with RoundTrips(self.locks) as counted:
                for i in range(100):
                    self.bench.SYSTEMS[system].apply_async((f"rtt-{i}",), queue=queue)
            trips[system] = round(counted.count / 100, 2)
        self.reset(queue)
        self.results["modes"] = {
            s: {
                "unique_us": round(median(unique[s]), 1),
                "unique_ratio": paired_ratio(unique[s], unique["plain"]),
                "duplicate_us": round(median(duplicate[s]), 1),
                "duplicate_ratio": paired_ratio(duplicate[s], unique["plain"]),
                "messages_published": published[s],
                "round_trips_per_dispatch": trips[s],
            }
            for s in MODES
        }

    # -- 10: many calls at once -------------------------------------------------------------

    def batch(self) -> None:
        # 1,000 calls over 100 keys: plain Celery sends each (1,000 messages); this
        # project's apply_many holds the batch's keys in one script and publishes one
        # message per key in one pipeline. Each system alone in its process, as in 1.
        calls, keys, queue = 1000, 100, "bench-batch"
        systems = (CONTROL, "this")
        seconds: dict[str, list[float]] = {s: [] for s in systems}
        published: dict[str, int] = {}
        queues = {system: f"{queue}-{system}" for system in systems}
        for round_no in range(self.args.rounds):
            self.reset(*queues.values())
            with alone.started(systems) as children:
                for child in children.values():
                    child.calls(queue, f"warm-{round_no}", WARM, keys=WARM // 5)
                self.reset(queue)
                for system in self.order(systems):
                    took = children[system].calls(queues[system], f"b-{round_no}", calls, keys=keys)
                    seconds[system].append(took)
                    published[system] = self.queued(queues[system])
        self.reset(queue, *queues.values())
        self.results["batch"] = {
            s: {
                "ms_per_batch": round(median(seconds[s]) * 1000, 1),
                "ratio": paired_ratio(seconds[s], seconds[CONTROL]),
                "ratio_range": paired_range(seconds[s], seconds[CONTROL]),
                "messages_published": published[s],
            }
            for s in systems
        }

    # -- 11: canvas with duplicates ---------------------------------------------------------

    def canvas(self) -> None:
        # 20 chains (a step, then a link) and a chord of 20 steps, the steps over 5 keys:
        # plain Celery runs every step; this project's duplicate steps attach to the one
        # that holds their key. Time from the first dispatch to the last result.
        count, keys, step_s = 20, 5, 0.2
        systems = ("plain", "this")
        chains: dict[str, list[float]] = {s: [] for s in systems}
        chords: dict[str, list[float]] = {s: [] for s in systems}
        steps: dict[str, int] = {}
        workers = self.workers("bench-canvas")
        try:
            for round_no in range(self.args.rounds):
                for system in self.order(systems):
                    queue = f"bench-canvas-{self.bench.side(system)}"
                    step, then, collect = self.bench.CANVAS[system]
                    self.r.delete(f"marks:{system}_step")
                    began = time.perf_counter()
                    sent = [
                        chain(
                            step.si(f"c{round_no}-{i % keys}", step_s).set(queue=queue),
                            then.s(i).set(queue=queue),
                        ).apply_async()
                        for i in range(count)
                    ]
                    for result in sent:
                        self._ended(result, system, workers)
                    chains[system].append(time.perf_counter() - began)
                    began = time.perf_counter()
                    header = [
                        step.si(f"h{round_no}-{i % keys}", step_s).set(queue=queue)
                        for i in range(count)
                    ]
                    body = collect.s().set(queue=queue)
                    if self._ended(chord(header)(body), system, workers) != count:
                        raise RuntimeError(f"{system}: the chord's body missed a result")
                    chords[system].append(time.perf_counter() - began)
                    steps[system] = int(self.r.llen(f"marks:{system}_step"))
        finally:
            for worker in workers.values():
                worker.stop()
        self.results["canvas"] = {
            s: {
                "chains_s": round(median(chains[s]), 2),
                "chains_ratio": paired_ratio(chains[s], chains["plain"]),
                "chord_s": round(median(chords[s]), 2),
                "chord_ratio": paired_ratio(chords[s], chords["plain"]),
                "steps_run": steps[s],
            }
            for s in systems
        }

    # -- 12: fair shares across keys --------------------------------------------------------

    def fairness(self) -> None:
        # One tenant floods (24 runs of 0.4 s at limit=2, total_limit=2, on one worker of
        # 4 processes), then another sends one call: how long it waits to start, and the
        # flood's runs a second, round robin (the default) against first come, first
        # served (the runs waiting in the pool, ``wait``).
        flood, run_s, queue = 24, 0.4, "bench-fair"
        waits: dict[str, list[float]] = {s: [] for s in FAIR}
        rates: dict[str, list[float]] = {s: [] for s in FAIR}
        self.reset(queue)
        worker = self.worker("this", queue, concurrency=4).start()
        try:
            for round_no in range(self.args.rounds):
                for system in self.order(FAIR):
                    waited, rate = self._flooded(system, f"{round_no}", flood, run_s, queue)
                    waits[system].append(waited)
                    rates[system].append(rate)
        finally:
            worker.stop()
        self.reset(queue)
        self.results["fairness"] = {
            s: {
                "late_first_wait_s": round(median(waits[s]), 2),
                "late_first_wait_runs": round(median(waits[s]) / run_s, 1),
                "flood_runs_per_s": round(median(rates[s]), 2),
                "flood_ratio": paired_ratio(rates[s], rates[FAIR[0]]),
            }
            for s in FAIR
        }

    def _flooded(
        self, system: str, tag: str, flood: int, run_s: float, queue: str
    ) -> tuple[float, float]:
        """One round of section 12 for ``system``: seconds the late tenant's call waited
        to start, and the flood's runs a second from its first start to its last end."""
        task = self.bench.SYSTEMS[system]
        self.r.delete(f"marks:{system}", f"started:{system}")
        flooding, late = f"a-{tag}", f"b-{tag}"
        for _ in range(flood):
            task.apply_async((flooding, run_s), queue=queue)
        deadline = time.monotonic() + 30
        while not self.r.llen(f"started:{system}"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{system}: the flood did not start")
            time.sleep(0.005)
        sent = time.time()
        task.apply_async((late, run_s), queue=queue)
        self.wait_marks(system, flood + 1, 120)
        marks = [_text(m).split("|") for m in self.r.lrange(f"marks:{system}", 0, -1)]
        late_start = min(float(start) for item, start, _ in marks if item == late)
        spans = [(float(start), float(end)) for item, start, end in marks if item == flooding]
        took = max(end for _, end in spans) - min(start for start, _ in spans)
        return late_start - sent, flood / took

    def _ended(self, result: Any, system: str, workers: dict[str, Worker]) -> Any:
        """``result``'s value once stored, polled every millisecond: Celery 5.7's ``get()``
        on a chain's result now and then misses the result's message and waits for ever,
        plain Celery's as this project's (about one in 300 on the bench machine)."""
        deadline = time.monotonic() + 60
        while not result.ready():
            if time.monotonic() > deadline:
                log = workers[self.bench.side(system)].output()[-4000:]
                raise RuntimeError(f"{system}: a canvas did not end:\n{log}")
            time.sleep(0.001)
        return result.get(timeout=10)

    # -- 3: end to end ---------------------------------------------------------------------

    def wait_marks(self, system: str, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while int(self.r.llen(f"marks:{system}")) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{system}: {self.r.llen(f'marks:{system}')}/{count} ran")
            time.sleep(0.005)

    def end_to_end(self) -> None:
        n = self.args.tasks
        workers = self.workers("bench-e2e")
        size = max(1, n // E2E_SLICES)
        rates: dict[str, list[float]] = {s: [] for s in ALL}
        alone: dict[str, list[float]] = {s: [] for s in ALL}
        try:
            for round_no in range(self.args.rounds):
                through = self._through(workers, f"e-{round_no}", size, E2E_SLICES)
                for system in ALL:
                    rates[system].append(size * E2E_SLICES / through[system].seconds)
                    alone[system].append(through[system].alone_rate)
            leftover = {s: self._keys_left(workers, s, size) for s in ALL}
        finally:
            for worker in workers.values():
                worker.stop()
        self.results["end_to_end"] = {
            s: {
                "tasks_per_s": round(median(rates[s]), 1),
                "ratio": paired_ratio(rates[s], rates["plain"]),
                "ratio_range": paired_range(rates[s], rates["plain"]),
                "worker_alone_tasks_per_s": round(median(alone[s]), 1),
                "worker_alone_ratio": paired_ratio(alone[s], alone["plain"]),
                "lock_keys_left": leftover[s],
            }
            for s in ALL
        }

    def _through(
        self,
        workers: dict[str, Worker],
        tag: str,
        size: int,
        slices: int,
        measured: Callable[[str, Worker], Callable[[], None]] | None = None,
    ) -> dict[str, Through]:
        """How each system took ``size`` distinct tasks through its worker (dispatched,
        then run), summed over ``slices``: the systems in a fresh order every slice, as
        ``_sliced``, so a drift of the machine's speed falls on all alike.
        ``measured(system, worker)`` is called before each system's slice and returns
        what to call after it."""
        self.reset()
        through = {s: Through() for s in ALL}
        for slice_no in range(slices):
            for system in self.order():
                task, worker = self.bench.SYSTEMS[system], workers[self.bench.side(system)]
                done = measured(system, worker) if measured is not None else None
                began = time.perf_counter()
                for i in range(size):
                    task.apply_async((f"{tag}-{slice_no}-{i}",), queue=worker.queue)
                sent = time.time()
                self.wait_marks(system, (slice_no + 1) * size, 300)
                through[system].seconds += time.perf_counter() - began
                if done is not None:
                    done()
                # The tasks its worker ran alone, once the last was sent: the backlog.
                ends = [
                    float(_text(mark).rsplit("|", 1)[1])
                    for mark in self.r.lrange(f"marks:{system}", slice_no * size, -1)
                ]
                after = [end for end in ends if end > sent]
                if after:
                    through[system].alone += len(after)
                    through[system].alone_seconds += max(after) - sent
        return through

    def _keys_left(self, workers: dict[str, Worker], system: str, size: int) -> int:
        """Lock keys left once ``size`` distinct tasks of ``system`` have run (fence
        bookkeeping, which expires with its lease, and results not counted)."""
        task, worker = self.bench.SYSTEMS[system], workers[self.bench.side(system)]
        self.reset()
        for i in range(size):
            task.apply_async((f"left-{i}",), queue=worker.queue)
        self.wait_marks(system, size, 300)
        time.sleep(0.2)  # releases land after the body's last mark
        return sum(
            1
            for k in self.lr.scan_iter("*")
            if not k.endswith(b":fence") and not k.startswith(b"celery-task-meta-")
        )

    # -- 4: contended hand-off -------------------------------------------------------------

    def gaps(self, system: str) -> list[float]:
        spans = sorted(
            (float(s), float(e))
            for _, s, e in (_text(m).split("|") for m in self.r.lrange(f"marks:{system}", 0, -1))
        )
        return [b[0] - a[1] for a, b in itertools.pairwise(spans)]

    def hand_off(self) -> None:
        n, queue, hold = self.args.handoffs, "bench-handoff", 0.01
        ours, theirs = f"{queue}-this", f"{queue}-others"
        # Two workers of each app, on that app's queue.
        workers = [*self.workers(queue, 1).values(), *self.workers(queue, 1).values()]
        gaps: dict[str, list[float]] = {}
        try:
            for system in ("this_wait", "this_requeue"):
                self.reset()
                task = getattr(self.bench, system)
                for _ in range(n):
                    task.apply_async(("one-key", hold), queue=ours)
                self.wait_marks(system, n, 300)
                gaps[system] = self.gaps(system)
            for system in INCUMBENTS:
                # No execution-level exclusion: a producer re-submits until accepted.
                self.reset()
                task = self.bench.SYSTEMS[system]
                deadline = time.monotonic() + 300
                while int(self.r.llen(f"started:{system}")) < n and time.monotonic() < deadline:
                    task.apply_async(("one-key", hold), queue=theirs)  # refused while held
                    time.sleep(0.001)
                self.wait_marks(system, n, 60)
                gaps[system] = self.gaps(system)
        finally:
            for worker in workers:
                worker.stop()
        self.results["hand_off"] = {
            s: {
                "handoffs": len(g),
                "median_ms": round(median(g) * 1000, 2),
                "p99_ms": round(percentile(g, 0.99) * 1000, 2),
            }
            for s, g in gaps.items()
        }

    # -- 5: crash recovery -----------------------------------------------------------------

    def crash(self) -> None:
        cap = self.args.crash_cap
        out: dict[str, dict[str, Any]] = {}
        for kind in ("child", "worker"):
            for system in ALL[1:]:
                self.reset()
                queue = f"bench-crash-{kind}-{system}"
                side = self.bench.side(system)
                doomed = self.worker(side, queue, 1).start()
                # The spare consumes its own queue: a pool that lost its child takes
                # seconds to replace it, which is Celery's delay, not the lock's.
                spare = self.worker(side, f"{queue}-spare", 1)
                task = self.bench.SYSTEMS[system]
                try:
                    task.apply_async(("crash", 60), queue=queue)
                    self._wait_started(system, 1, 20)
                    if kind == "child":
                        for child in doomed.children():
                            os.kill(child, 9)
                    else:
                        doomed.kill()
                    spare.start()
                    killed = time.monotonic()
                    ran = False
                    while time.monotonic() - killed < cap:
                        task.apply_async(("crash", 60), queue=spare.queue)  # same arguments
                        if int(self.r.llen(f"started:{system}")) >= 2:
                            ran = True
                            break
                        time.sleep(0.05)
                    out.setdefault(system, {})[f"{kind}_kill_s"] = (
                        round(time.monotonic() - killed, 2) if ran else f"> {cap:g}"
                    )
                finally:
                    doomed.stop()
                    spare.stop()
        self.results["crash_recovery"] = out

    def _wait_started(self, system: str, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while int(self.r.llen(f"started:{system}")) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{system} did not start")
            time.sleep(0.005)

    # -- 6: round trips ------------------------------------------------------------------

    def round_trips(self) -> None:
        out: dict[str, dict[str, float]] = {}
        # this_history: the default lock keeping its history (each event written by its
        # operation's own script). One app's worker at a time: an idle worker's own
        # polls would be counted.
        systems = (*ALL, "this_history")
        for side in self.bench.APPS:
            mine = [s for s in systems if self.bench.side(s) == side]
            out.update(self._round_trips(side, mine))
        self.results["round_trips"] = out

    def _round_trips(self, side: str, systems: list[str]) -> dict[str, dict[str, float]]:
        n, idle = 100, f"bench-rtt-idle-{side}"
        out: dict[str, dict[str, float]] = {}
        worker = self.worker(side, idle).start()
        app = self.bench.APPS[side]
        try:
            for system in systems:
                task = self.bench.SYSTEMS[system]
                queue = f"bench-rtt-{system}"
                self.reset()
                task.apply_async(("rtt-warm",), queue=idle)  # loads scripts, opens pools
                self.wait_marks(system, 1, 30)
                time.sleep(0.3)
                self.reset()
                # Dispatch with nobody consuming, then let the worker consume: the two
                # sides' commands are counted apart.
                with RoundTrips(self.locks) as counted:
                    for i in range(n):
                        task.apply_async((f"rtt-{i}",), queue=queue)
                    time.sleep(0.2)
                dispatched = counted.count
                with RoundTrips(self.locks) as counted:
                    app.control.add_consumer(
                        queue, destination=[f"{worker.name}@{platform.node()}"], reply=True
                    )
                    self.wait_marks(system, n, 120)
                    time.sleep(0.5)
                executed = counted.count
                out[system] = {
                    "per_dispatch": round(dispatched / n, 2),
                    "per_execution": round(executed / n, 2),
                }
        finally:
            worker.stop()
        return out

    # -- 9: a rate-limited run's start -------------------------------------------------

    def rate_starts(self) -> None:
        """Distinct keys through one prefork worker, each run asking its rate for a slot
        (free at once: the decision's price, not a wait): one limit, and two limits with
        a cost callable, beside plain Celery; the pool children's CPU and the server's
        time in scripts per task."""
        n, systems = self.args.tasks, RATED
        workers = self.workers("bench-rates")
        servers = {"locks": self.locks}
        spent: dict[str, dict[str, list[float]]] = {s: {} for s in systems}
        try:
            for round_no in range(self.args.rounds):
                for system in self.order(systems):
                    task, worker = self.bench.SYSTEMS[system], workers[self.bench.side(system)]
                    self.reset()
                    self.locks.client().config_resetstat()
                    before = cpu_seconds(worker.pid, servers, {})
                    began = time.perf_counter()
                    for i in range(n):
                        task.apply_async((f"r-{round_no}-{i}",), queue=worker.queue)
                    self.wait_marks(system, n, 300)
                    took = time.perf_counter() - began
                    time.sleep(0.2)  # releases land after the body's last mark
                    after = cpu_seconds(worker.pid, servers, {})
                    stats = self.locks.client().info("commandstats")
                    scripts = sum(
                        int(stats.get(f"cmdstat_{c}", {}).get("usec", 0)) for c in SCRIPTS
                    )
                    row = spent[system]
                    row.setdefault("tasks_per_s", []).append(n / took)
                    row.setdefault("pool_children_us", []).append(
                        (after["pool_children"] - before["pool_children"]) / n * 1e6
                    )
                    row.setdefault("redis_scripts_us", []).append(scripts / n)
        finally:
            for worker in workers.values():
                worker.stop()
        plain = spent["plain"]["tasks_per_s"]
        self.results["rate_starts"] = {
            s: {
                "tasks_per_s": round(median(spent[s]["tasks_per_s"]), 1),
                "ratio": paired_ratio(spent[s]["tasks_per_s"], plain),
                "pool_children_us": round(median(spent[s]["pool_children_us"])),
                "redis_scripts_us": round(median(spent[s]["redis_scripts_us"]), 1),
            }
            for s in systems
        }

    # -- 8: where the time goes ---------------------------------------------------------

    def cost(self) -> None:
        """CPU time per task of every process a task passes through, end to end as in 3:
        this producer, the worker's main process, its pool children, each Redis server,
        and the servers' time in scripts (``INFO commandstats``: EVAL and EVALSHA)."""
        n = self.args.tasks
        workers = self.workers("bench-cost")
        servers = {"redis": self.broker}
        if self.locks is not self.broker:
            servers = {"broker": self.broker, "locks": self.locks}
        sessions = {}
        if self.rabbitmq is not None and self.rabbitmq.process is not None:
            sessions["rabbitmq"] = self.rabbitmq.process.pid  # its processes' session
        spent: dict[str, dict[str, list[float]]] = {s: {} for s in ALL}
        size = max(1, n // E2E_SLICES)
        try:
            for round_no in range(self.args.rounds):
                used: dict[str, dict[str, float]] = {s: {} for s in ALL}
                measured = self._metered(servers, sessions, used)
                self._through(workers, f"c-{round_no}", size, E2E_SLICES, measured)
                for system, row in used.items():
                    wall = row.pop(WALL)
                    per_task = {k: v / (size * E2E_SLICES) * 1e6 for k, v in row.items()}
                    processes = [v for k, v in row.items() if not k.endswith("_scripts")]
                    per_task["total"] = sum(processes) / (size * E2E_SLICES) * 1e6
                    for key, value in per_task.items():
                        spent[system].setdefault(key, []).append(value)
                    spent[system].setdefault("cores", []).append(sum(processes) / wall)
        finally:
            for worker in workers.values():
                worker.stop()
        cost: dict[str, dict[str, float]] = {
            s: {f"{k}_us": round(median(v)) for k, v in spent[s].items() if k != "cores"}
            for s in ALL
        }
        plain = cost["plain"]["total_us"]
        for system, row in cost.items():
            scripts = sum(v for k, v in row.items() if k.endswith("_scripts_us"))
            # Plain's total over each system's (what throughput would follow were the
            # cores the limit: ``cores_used`` says how near they were), and what that
            # ratio would be if the servers' time in scripts were all a system added
            # (its clients costing what plain's do): the floor.
            row["cores_used"] = round(median(spent[system]["cores"]), 2)
            row["cpu_ratio"] = round(plain / row["total_us"], 2)
            row["floor_ratio"] = round(plain / (plain + scripts), 2)
        self.results["cost"] = cost

    @staticmethod
    def _metered(
        servers: dict[str, RedisServer],
        sessions: dict[str, int],
        used: dict[str, dict[str, float]],
    ) -> Callable[[str, Worker], Callable[[], None]]:
        """``_through``'s ``measured``: adds each slice's CPU seconds of every process,
        each server's seconds in scripts, and its wall-clock seconds (``WALL``) to
        ``used[system]``."""

        def measured(system: str, worker: Worker) -> Callable[[], None]:
            for server in servers.values():
                server.client().config_resetstat()
            before = cpu_seconds(worker.pid, servers, sessions)
            began = time.perf_counter()

            def done() -> None:
                time.sleep(0.05)  # the last task's result and release land
                after = cpu_seconds(worker.pid, servers, sessions)
                row = used[system]
                row[WALL] = row.get(WALL, 0.0) + time.perf_counter() - began
                for key, value in before.items():
                    row[key] = row.get(key, 0.0) + after[key] - value
                for name, server in servers.items():
                    stats = server.client().info("commandstats")
                    in_scripts = sum(
                        int(stats.get(f"cmdstat_{c}", {}).get("usec", 0)) for c in SCRIPTS
                    )
                    row[f"{name}_scripts"] = row.get(f"{name}_scripts", 0.0) + in_scripts / 1e6

            return done

        return measured


@dataclass
class Through:
    """One system's tasks taken through its worker in ``Bench._through``'s slices: the
    seconds from each slice's first dispatch to its last run, and the tasks its worker
    ran alone once the slice's last was sent (the backlog) and the seconds they took."""

    seconds: float = 0.0
    alone: int = 0
    alone_seconds: float = 0.0

    @property
    def alone_rate(self) -> float:
        return self.alone / self.alone_seconds if self.alone_seconds else 0.0


SCRIPTS = ("eval", "evalsha", "eval_ro", "evalsha_ro", "fcall")
# End to end (3 and 8), every round runs the systems in this many slices.
E2E_SLICES = 4
# The wall-clock seconds of a system's slices, beside their CPU seconds (``_metered``).
WALL = "wall"


def _stat_cpu(pid: int) -> float:
    return _cpu(_stat_fields(Path(f"/proc/{pid}")))


def _cpu(fields: list[str]) -> float:
    """User + system CPU seconds from a process's stat fields (0 when it is gone)."""
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") if fields else 0.0


def cpu_seconds(
    worker: int, servers: dict[str, RedisServer], sessions: dict[str, int]
) -> dict[str, float]:
    """CPU seconds used so far (user + system) by this process (the producer), the worker's
    main process, its children together, each Redis server, and the processes of each
    of ``sessions`` (name -> session id: a server that runs several, RabbitMQ's)."""
    processes = [_stat_fields(entry) for entry in Path("/proc").iterdir() if entry.name.isdigit()]
    found = {
        "producer": time.process_time(),
        "worker_main": _stat_cpu(worker),
        "pool_children": sum(_cpu(f) for f in processes if f[1:2] == [str(worker)]),
    }
    for name, server in servers.items():
        found[name] = _stat_cpu(server.pid)
    for name, session in sessions.items():
        found[name] = sum(_cpu(f) for f in processes if f[3:4] == [str(session)])
    return found


def _stat_fields(entry: Path) -> list[str]:
    """A process's /proc stat fields after its name (state, parent, group, session, ...);
    none when it is gone."""
    try:
        return (entry / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


class RoundTrips:
    """Counts the round trips clients make to a Redis: the reads it processed (INFO stats
    ``total_reads_processed``), less this counter's own. A script, or commands written
    together (a pipeline), arrive in one read: one round trip however much they do."""

    def __init__(self, server: RedisServer) -> None:
        self.client = server.client()
        self.client.ping()  # connect (and its handshake) before counting starts
        self.count = 0
        self._start = 0

    def _reads(self) -> int:
        return int(self.client.info("stats")["total_reads_processed"])

    def __enter__(self) -> RoundTrips:
        self._start = self._reads()
        return self

    def __exit__(self, *exc: object) -> None:
        self.count = self._reads() - self._start - 1  # the INFO that started the count
        self.client.close()


def machine() -> str:
    cores = os.cpu_count()
    version = subprocess.run(
        [os.environ.get("REDIS_SERVER_BIN", "redis-server"), "--version"],
        capture_output=True, text=True, check=False,
    ).stdout.split(" ")[2:3]  # fmt: skip
    import celery  # noqa: PLC0415

    return (
        f"{platform.system()} {platform.machine()}, {cores} cores, Python "
        f"{platform.python_version()}, Celery {celery.__version__}, redis-server "
        f"{''.join(version)}"
    )


# Why the figures are what they are, in prose kept beside the bench (not in a run's output).
READING = [
    line
    for line in (Path(__file__).parent / "reading.md").read_text().splitlines()
    if not line.startswith("<!--")
]


def render(results: dict[str, Any], command: str) -> str:
    out = [
        "# Benchmarks",
        "",
        "Plain Celery, celery-singleton 0.3.1, celery-once 3.0.1 and this project in one run on "
        "one machine, systems interleaved in every round; medians; ratios against plain Celery "
        "measured in the same run and configuration (dispatch: each system in a process of its "
        "own, against plain Celery alone in its own). Regenerate with the command below; every "
        "number is one the run printed.",
        "",
        f"- command: `{command}`",
        f"- date: {results['date']}",
        f"- machine: {results['machine']}",
        f"- rounds: {results['rounds']}",
    ]
    for update in results.get("updates", []):
        out.append(f"- then `{update['command']}` at {update['date']} (its sections only)")
    out += ["", "## Reading the figures", "", *READING, ""]
    for config, part in results["configs"].items():
        out += [f"# Configuration `{config}`: {CONFIGS[config]}", ""]
        out += _sections(part["results"], config)
    return "\n".join(out)


def _sections(r: dict[str, Any], config: str) -> list[str]:
    def table(
        title: str,
        rows: dict[str, dict[str, Any]],
        note: str,
        first: str = "system",
        level: int = 2,
    ) -> list[str]:
        columns = list(next(iter(rows.values())).keys())
        head = f"| {first} | " + " | ".join(columns) + " |"
        lines = [f"{'#' * level} {title}", "", note, "", head]
        lines.append("|---|" + "---|" * len(columns))
        for system, row in rows.items():
            lines.append(f"| {system} | " + " | ".join(str(row[c]) for c in columns) + " |")
        return [*lines, ""]

    out: list[str] = []
    notes = {
        "dispatch_unique": (
            "1. Dispatch, unique arguments",
            "Microseconds per `apply_async()`, each system in a process of its own that "
            f"imports it alone, as its users run it (started afresh every round, {WARM} "
            f"unique and {WARM} repeated calls before the clock runs); each round sends the "
            "processes 8 slices each, in a fresh order per slice. plain_alone, the control: "
            "plain Celery, one app, one task, nothing else imported. Ratio: the median of "
            "the rounds' ratios to plain_alone. plain: plain Celery's task in the app the "
            "other sections run, every system imported and registered in its process. "
            "this_idempotent: this project with an idempotency key per call (the key's "
            "claim, then the call's own dispatch). hold_floor: plain Celery with the least a "
            "hold can add on Celery's own publish path (a key digest, then one script "
            "that checks the key, pushes and holds, riding the push where the locks are "
            "on the broker's Redis; a SET NX on the lock server before the publish "
            "elsewhere), the floor of any lock that lets Celery publish. "
            "Until 2026-12 every system ran in the "
            "bench's own process, and plain measured 1,263 µs where alone it takes about "
            "400: not the process (the plain row shows sharing it costs nothing) but that "
            "run's machine load, which swung one round of plain from 340 to 830 µs. The "
            "process of its own per system, started afresh every round, and plain alone "
            "measured in the same slices keep such load off the ratios.",
        ),
        "dispatch_duplicate": (
            "2. Dispatch, duplicate",
            "Microseconds per refused duplicate, each system in its process of 1, in slices "
            "interleaved as in 1, as a ratio of plain_alone's `delay()` with the same "
            "arguments in the same slices, and how many messages reached the broker "
            "(correct: 1; plain Celery has no check). "
            "this_idempotent: the same call repeated with its idempotency key, answered "
            "from the key's record with the first call's result. this_events_on: a "
            "producer with `task_send_sent_event`, each refusal also sent as a Celery event; "
            "this_no_receivers: the events' receivers disconnected, against which `this` "
            "(events off, as every producer runs it) shows what events off costs; "
            "this_again: `this` in another process, how far two processes of the same code "
            "differ.",
        ),
        "end_to_end": (
            "3. End-to-end throughput",
            "Distinct tasks through one prefork worker (concurrency 2), dispatch included; "
            f"each round runs the systems in {E2E_SLICES} slices, in a fresh order per slice, each "
            "slice timed from its first dispatch to its last task's run. Ratio: the median "
            "of the rounds' ratios to plain. worker_alone: the rate at which the worker "
            "ran the tasks still queued once a slice's last was sent (no producer beside "
            "it), and its ratio. Lock keys left after a further batch (fence bookkeeping, "
            "which expires with the lease, not counted).",
        ),
        "hand_off": (
            "4. Contended hand-off",
            "Two workers, one key, back-to-back executions: time from one execution's end "
            "to the next one's start. This project's `wait` (push wake-up) and `requeue` "
            "(backoff 10-100 ms); the incumbents have no execution-level lock, so a producer "
            "re-submits every millisecond until accepted.",
        ),
        "crash_recovery": (
            "5. Crash recovery",
            "Time until a task with the same arguments runs again after SIGKILL of the pool "
            "child or of the whole worker (this project's lease ttl: 30 s; the incumbents' "
            "lock TTL: 60 s), re-submitting every 50 ms to a spare worker.",
        ),
        "round_trips": (
            "6. Redis round trips",
            (
                "Round trips to the one Redis server (broker, results and locks) per "
                "dispatch and per execution, plain Celery's included: the reads it processed "
                "(`INFO stats` total_reads_processed), so commands written together count "
                "once, 100 tasks each."
            )
            if config == "default"
            else "Round trips to the Redis server with the locks and results (the messages "
            "go to RabbitMQ) per dispatch and per execution: the reads it processed (`INFO "
            "stats` total_reads_processed), so commands written together count once, 100 "
            "tasks each."
            if config == "rabbitmq"
            else "Round trips to the lock store per dispatch and per execution: the reads it "
            "processed (`INFO stats` total_reads_processed), so commands written together "
            "count once, 100 tasks each.",
        ),
        "modes": (
            "7. Lock modes",
            "This project's modes (docs/modes.md) against plain Celery in the same run: "
            "microseconds per unique dispatch and per duplicate (ratios: the median of "
            "the rounds' ratios to a plain unique dispatch), messages that reached the "
            "broker for 1 + dispatches duplicate calls, and lock-store round trips per "
            "unique dispatch. A replace, debounce or cancel duplicate publishes the new "
            "arguments under the queued call's id (a swap and a message); while_executing, limit "
            "and rate do no dispatch check: every call is published (rate_delay reserves "
            "each call's slot first and sends it with the countdown to it). this_history: "
            "the default lock with `history=True`, each entry written by its operation's script.",
        ),
        "cost": (
            "8. Where the time goes",
            "CPU microseconds per task of each process, end to end in slices as in 3 (1 producer, "
            "the worker's main process, its 2 pool children, the Redis server(s), the "
            "RabbitMQ node's processes where it is the broker), and the "
            "servers' time inside scripts (`INFO commandstats`); medians of the rounds. "
            "`cores_used`: those processes' CPU over the slices' wall-clock time, of the "
            "machine's 2. `cpu_ratio` is plain's total over the system's: the throughput "
            "ratio were the cores the limit. Below 2 cores they are not the whole limit: "
            "every message passes through the worker's main process in turn, which also "
            "waits for its round trips and for the cores its pool children hold (section "
            "3's worker_alone). `floor_ratio`: cpu_ratio if the lock work in the servers' "
            "scripts were all the system added (clients as plain's).",
        ),
        "rate_starts": (
            "9. A rate-limited run's start",
            "Distinct keys through one prefork worker (concurrency 2), dispatch included, "
            "each run asking its key's rate for a slot before it starts (free at once: "
            'what the decision costs, not a wait). this_rate: `rate="100/s"`; '
            'this_rates: `rate=["100/s", RateLimit("100000/m", burst=1000, '
            "cost=tokens)]`, both limits and the cost callable in the one script. Ratio: "
            "the median of the rounds' ratios to plain; the pool children's CPU and the "
            "lock server's time in scripts, per task.",
        ),
        "batch": (
            "10. Many calls at once",
            "Milliseconds for 1,000 calls over 100 distinct arguments, each system alone "
            "in its process as in 1: plain_alone sends all 1,000 (`apply_async` each); this "
            "project's `apply_many` decides the batch's holds in one lock-store script and "
            "publishes one message per key in one broker pipeline. Ratio: the median of "
            "the rounds' ratios to plain_alone; messages that reached the broker.",
        ),
        "canvas": (
            "11. Canvas with duplicates",
            "One prefork worker (concurrency 2) per system: 20 chains, each a step (0.2 s) "
            "then a link, and a chord of 20 steps, the steps over 5 distinct arguments; "
            "seconds from the first dispatch to the last result (the chord: its body's), "
            "medians of the rounds, ratios to plain Celery, which runs every step. Here a "
            "duplicate step inside a canvas attaches to the call that holds its key and "
            "ends with its result; steps_run: the steps whose bodies ran in the last "
            "round (chains and chord).",
        ),
        "fairness": (
            "12. Fair shares across keys",
            "One prefork worker (concurrency 4), `limit=2, total_limit=2`: one tenant "
            "sends 24 calls of 0.4 s, and once the first has started another tenant sends "
            "one. late_first_wait: seconds (and runs of 0.4 s) from that call's dispatch to "
            "its start; flood_runs_per_s: the flood's runs a second, from its first start "
            "to its last end (at most 5: two slots of 0.4 s). this_fair: round robin across "
            "keys (the default: waiting calls kept in the lock store, each freed slot to "
            'the key served least); this_fair_first: `total_order="first_come"` with '
            "`on_contention=wait(...)`, the runs waiting in the pool in arrival order. "
            "flood_ratio: the median of the rounds' ratios to this_fair_first.",
        ),
    }
    if all(k in r for k in CHARTED):
        out += [
            f"![Ratios to plain Celery, side by side](img/benchmark-ratios-{config}.svg)",
            "",
            "Drawn from this run by the same command (lower is better for dispatch, "
            "higher for throughput).",
            "",
        ]
    for key, (title, note) in notes.items():
        if key in r:
            out += table(title, r[key], note)
        rest = left(config, r["cost"]) if key == "cost" and key in r else {}
        if rest:
            out += table(
                "What is left, per process",
                rest,
                "This project's CPU per task over plain Celery's in each process above, "
                "beside the better incumbent's over plain's, and what this project's part "
                "of that process pays for.",
                first="process",
                level=3,
            )
    found = checks(config, r)
    if found:
        out += table(
            "13. Targets",
            found,
            "The figures this project is held to in this configuration, against this "
            "run's (ratios to plain Celery, or to the incumbents' in the same run); where "
            "one is not reached, section 8 shows per process what is left.",
            first="#",
        )
    return out


# (chart group, results key, ratio field)
CHARTED = {
    "dispatch_unique": ("unique dispatch", "ratio"),
    "dispatch_duplicate": ("refused duplicate", "ratio_to_plain_delay"),
    "end_to_end": ("end-to-end throughput", "ratio"),
}


def _charted(rows: dict[str, Any], system: str) -> dict[str, Any]:
    """``system``'s row in a charted section: plain Celery's is the control where the
    section has one (dispatch: plain alone in its process)."""
    return dict(rows.get(CONTROL if system == "plain" else system) or rows.get(system, {}))


def chart(r: dict[str, Any], config: str) -> str:
    """The three headline ratios of every system, side by side."""
    values = {
        (group, system): float(_charted(r[key], system)[field])
        for key, (group, field) in CHARTED.items()
        for system in ALL
        if key != "dispatch_duplicate" or system != "plain"  # plain has no duplicate check
    }
    # Each round's ratio, lowest to highest (runs from before the ranges were kept: none).
    spread = {
        (group, system): tuple(_charted(r[key], system)[f"{field}_range"])
        for key, (group, field) in CHARTED.items()
        for system in ALL
        if len(_charted(r[key], system).get(f"{field}_range", ())) == 2
    }
    names = {"plain": "plain Celery", "celery_singleton": "celery-singleton",
             "celery_once": "celery-once", "this": "celery-singleton-lock"}  # fmt: skip
    shown = {(group, names[system]): value for (group, system), value in values.items()}
    return grouped_bars(
        f"Ratios to plain Celery, same run ({config}): medians, bars from the lowest to "
        "the highest round",
        [g for g, _ in CHARTED.values()],
        [names[s] for s in ALL],
        shown,
        spread={(group, names[system]): (lo, hi) for (group, system), (lo, hi) in spread.items()},
    )


def write_pages(results: dict[str, Any], output: Path) -> None:
    command = str(results.get("command") or "python3 scripts/dev.py bench")
    output.write_text(render(results, command))
    for config, part in results["configs"].items():
        if all(k in part["results"] for k in CHARTED):
            image = output.parent / "img" / f"benchmark-ratios-{config}.svg"
            image.parent.mkdir(parents=True, exist_ok=True)
            image.write_text(chart(part["results"], config))
    print(f"wrote {output}")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """One configuration's scenarios, in this process (its app is configured at import)."""
    bench = Bench(args)
    scenarios: dict[str, Callable[[], None]] = {
        "dispatch": bench.dispatch,
        "end_to_end": bench.end_to_end,
        "hand_off": bench.hand_off,
        "crash": bench.crash,
        "round_trips": bench.round_trips,
        "modes": bench.modes,
        "cost": bench.cost,
        "rate_starts": bench.rate_starts,
        "batch": bench.batch,
        "canvas": bench.canvas,
        "fairness": bench.fairness,
    }
    try:
        for name, scenario in scenarios.items():
            if not args.only or name in args.only:
                print(f"[bench] {args.config}: {name} ...", flush=True)
                scenario()
                print(json.dumps({k: bench.results[k] for k in bench.results}, indent=1)[-1500:])
    finally:
        bench.close()
    return bench.results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", nargs="*", choices=sorted(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dispatches", type=int, default=2000)
    parser.add_argument("--tasks", type=int, default=2000)  # per end-to-end round
    parser.add_argument("--handoffs", type=int, default=50)
    parser.add_argument("--crash-cap", type=float, default=35.0)
    parser.add_argument("--only", nargs="*", help="scenarios to run (default: all)")
    parser.add_argument("--output", default=str(ROOT / "docs" / "benchmarks.md"))
    parser.add_argument("--part", help=argparse.SUPPRESS)  # a child's results file
    parser.add_argument(
        "--render-only", action="store_true", help="redraw the page from benchmarks/results.json"
    )
    args = parser.parse_args()
    saved_path = ROOT / "benchmarks" / "results.json"
    if args.render_only:
        write_pages(json.loads(saved_path.read_text()), Path(args.output))
        return 0
    if args.part:
        [args.config] = args.config
        Path(args.part).write_text(json.dumps(measure(args)))
        return 0
    configs: dict[str, Any] = {}
    if "rabbitmq" in args.config and not rabbitmq_available():
        print("[bench] no rabbitmq-server here: the rabbitmq configuration is skipped", flush=True)
        args.config.remove("rabbitmq")
    for config in args.config:
        # A process per configuration: the bench app reads its servers at import.
        part = ROOT / "benchmarks" / f".part-{config}.json"
        child = [a for a in sys.argv[1:] if a != "--config" and a not in CONFIGS]
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.run", *child, "--config", config, "--part", part],
            cwd=ROOT, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            return done.returncode
        configs[config] = {"results": json.loads(part.read_text())}
        part.unlink()
    date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    command = ("python3 scripts/dev.py bench " + " ".join(sys.argv[1:])).strip()
    if args.only and saved_path.exists():
        # Some scenarios only: they replace theirs in the last full run's page, and the
        # page says which were measured when.
        results = json.loads(saved_path.read_text())
        for config, part in configs.items():
            kept = results["configs"].setdefault(config, {"results": {}})["results"]
            kept.update(part["results"])
        # The same scenarios measured again replace their earlier update.
        updates = [u for u in results.get("updates", []) if u["command"] != command]
        results["updates"] = [*updates, {"date": date, "command": command}]
    else:
        results = {
            "date": date,
            "machine": machine(),
            "rounds": args.rounds,
            "command": command,
            "configs": configs,
        }
    saved_path.write_text(json.dumps(results, indent=2))
    write_pages(results, Path(args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
