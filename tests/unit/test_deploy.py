"""The shipped Grafana dashboard and Prometheus alert rules ask only for metrics the library
exports (``exported.METRICS``), and show each one; ``promtool check rules`` where installed
(``dev.py ci`` fetches Debian's: ``PROMTOOL_BIN``)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from celery_singleton_lock.contrib.exported import METRICS

from ..support.dashboard import targets

DEPLOY = Path(__file__).resolve().parent.parent.parent / "deploy"
RULES = DEPLOY / "prometheus" / "celery-singleton-lock-alerts.yml"
RULE_TESTS = Path(__file__).resolve().parent / "alerts-test.yml"  # promtool's cases
PROMTOOL = os.environ.get("PROMTOOL_BIN") or shutil.which("promtool")
DASHBOARD = DEPLOY / "grafana" / "celery-singleton-lock.json"
NAME = re.compile(r"\bcelery_singleton_lock_[a-z_]+")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exported() -> dict[str, str]:
    """Each series name Prometheus scrapes from the library, with the metric it belongs to."""
    return {
        metric.name + suffix: metric.name for metric in METRICS for suffix in SUFFIXES[metric.kind]
    }


def rules() -> list[dict[str, Any]]:
    loaded = yaml.safe_load(RULES.read_text())
    return [rule for group in loaded["groups"] for rule in group["rules"]]


def dashboard_exprs() -> Iterator[str]:
    board = json.loads(DASHBOARD.read_text())
    for panel in board["panels"]:
        for target in panel["targets"]:
            yield target["expr"]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            yield variable["definition"]


def balanced(expr: str) -> bool:
    depth = 0
    for char in expr:
        depth += {"(": 1, "{": 1, "[": 1, ")": -1, "}": -1, "]": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


class TestAlertRules:
    def test_each_rule_is_named_says_why_and_asks_for_exported_series(self) -> None:
        found = rules()
        assert {r["alert"] for r in found} >= {
            "SingletonLockHeldPastItsRunTime",
            "SingletonLockRefusalsHigh",
            "SingletonLockLeasesLost",
            "SingletonLockBrokerRideOff",
        }
        for rule in found:
            assert rule["labels"]["severity"] in {"info", "warning", "critical"}, rule
            assert rule["annotations"]["summary"], rule
            names = NAME.findall(rule["expr"])
            assert names, rule["alert"]
            assert set(names) <= set(exported()), (rule["alert"], names)
            assert balanced(rule["expr"]), rule["alert"]

    @pytest.mark.oneoff  # promtool is fetched for the one-offs (dev.py ci)
    @pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed")
    def test_promtool_checks_the_rules(self) -> None:
        assert PROMTOOL is not None
        done = subprocess.run(
            [PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr

    @pytest.mark.oneoff
    @pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed")
    def test_each_alert_fires_on_its_series_and_stays_quiet_on_healthy_ones(self) -> None:
        assert PROMTOOL is not None
        done = subprocess.run(
            [PROMTOOL, "test", "rules", str(RULE_TESTS)],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "SUCCESS" in done.stdout

    def test_the_promtool_cases_cover_every_alert_and_ask_for_exported_series(self) -> None:
        cases = yaml.safe_load(RULE_TESTS.read_text())
        assert cases["rule_files"] == [os.path.relpath(RULES, RULE_TESTS.parent)]
        series = [given["series"] for case in cases["tests"] for given in case["input_series"]]
        assert {NAME.match(s)[0] for s in series if NAME.match(s)} <= set(exported())
        fired = {
            test["alertname"]
            for case in cases["tests"]
            for test in case["alert_rule_test"]
            if test["exp_alerts"]
        }
        assert fired == {rule["alert"] for rule in rules()}


class TestDashboard:
    def test_every_query_asks_for_exported_series(self) -> None:
        for expr in dashboard_exprs():
            names = NAME.findall(expr)
            assert names, expr
            assert set(names) <= set(exported()), names
            assert balanced(expr), expr

    def test_every_metric_the_library_exports_is_shown(self) -> None:
        shown = {exported()[name] for expr in dashboard_exprs() for name in NAME.findall(expr)}
        assert shown == {metric.name for metric in METRICS}

    def test_grafanas_variables_are_all_replaced_as_the_prometheus_test_asks(self) -> None:
        """tests/integration/test_dashboard.py runs each query on a real Prometheus with
        the variables replaced as Grafana does: none is left for Prometheus to refuse."""
        asked = [t.asked(interval=1, scrape=1, range_s=60) for t in targets(DASHBOARD)]
        assert asked
        assert not [expr for expr in asked if "$" in expr]
        assert "[4s]" in asked[0]  # max(1 s step + 1 s scrape, 4 x 1 s scrape)

    def test_panels_do_not_overlap(self) -> None:
        board = json.loads(DASHBOARD.read_text())
        cells = set()
        for panel in board["panels"]:
            at = panel["gridPos"]
            covered = {
                (x, y)
                for x in range(at["x"], at["x"] + at["w"])
                for y in range(at["y"], at["y"] + at["h"])
            }
            assert not covered & cells, panel["title"]
            cells |= covered
