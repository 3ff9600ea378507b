"""The README's demo, run in a reduced size: real workers, a killed worker, the report."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from ..support.workers import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.oneoff]


def run_demo(*args: str) -> tuple[int, str]:
    env = {**os.environ, "DEMO_LOCK_TTL": "1"}
    env.pop("REDIS_URL", None)  # the demo starts its own private Redis
    demo = subprocess.Popen(
        [sys.executable, "-m", "example_project.demo", "--requests", "60", "--coupons", "5",
         "--claimers", "12", "--pause", "2.5", "--timeout", "150", *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        output, _ = demo.communicate(timeout=200)
    except subprocess.TimeoutExpired:
        demo.send_signal(signal.SIGTERM)  # the demo stops the workers and Redis it started
        output, _ = demo.communicate(timeout=60)
        raise AssertionError(f"the demo did not finish:\n{output[-3000:]}") from None
    return demo.returncode, output


def figure(report: str, label: str) -> int:
    match = re.search(rf"{label}:? (\d+)", report)
    assert match, f"{label!r} missing from the report:\n{report}"
    return int(match.group(1))


@pytest.mark.timeout(280)
class TestDemo:
    def test_with_locks_every_request_is_processed_and_called_back_once(self) -> None:
        code, report = run_demo()
        print(report[-700:])
        assert code == 0, report
        assert figure(report, "requests") == 60
        assert figure(report, "processed once") == 60
        assert figure(report, "processed twice") == 0
        assert figure(report, "callbacks twice") == 0
        assert figure(report, "duplicates refused at dispatch") > 0
        assert "(no worker killed)" not in report
        assert figure(report, "oversold") == 0
        assert figure(report, "stale writes rejected by fence") == 1
        assert "[##############################] 60/60" in report

    def test_bad_arguments_are_refused(self) -> None:
        code, report = run_demo("--workers", "1")
        assert code == 2
        assert "--workers must be at least 2" in report

    def test_sigterm_stops_everything_the_demo_started(self) -> None:
        demo = subprocess.Popen(
            [sys.executable, "-m", "example_project.demo", "--requests", "400"],
            cwd=ROOT, env={**os.environ, "DEMO_LOCK_TTL": "1"}, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            assert demo.stdout is not None
            assert "requests called back" in demo.stdout.read(200)  # workers are up
            started = workers_running()
            assert started
            demo.send_signal(signal.SIGTERM)
            demo.wait(60)
        finally:
            if demo.poll() is None:
                demo.kill()
                demo.wait(10)
            if demo.stdout:
                demo.stdout.close()
        assert not set(started) & set(workers_running())


def workers_running() -> list[int]:
    """PIDs of processes running the demo's Celery app."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue
            if b"example_project.celeryapp" in cmdline or b"--dir\x00/tmp/csl-demo-" in cmdline:
                found.append(int(entry))
    return found
