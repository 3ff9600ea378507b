"""A real Prometheus server for the tests: its own temp dir, a generated config scraping the
given targets every second, on a free loopback port, asked over its HTTP API, stopped by PID.

The binary is ``$PROMETHEUS_BIN`` (``dev.py ci`` fetches Debian's) or ``prometheus`` on PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .http_service import HttpService
from .runs import wait_for

PROMETHEUS = os.environ.get("PROMETHEUS_BIN") or shutil.which("prometheus")
SCRAPE_INTERVAL = 1.0  # seconds; the datasource's, as Grafana's $__rate_interval reads it
# However the test ends, the server ends by then (coreutils' timeout), besides its stop.
LIFETIME = 600


class Prometheus(HttpService):
    """``prometheus`` scraping ``targets`` (job name -> host:port) every second."""

    HEALTH = "/-/ready"

    def __init__(self, targets: Mapping[str, str]) -> None:
        assert PROMETHEUS is not None
        self.binary = PROMETHEUS
        self.home = Path(tempfile.mkdtemp(prefix="csl-prometheus-"))
        super().__init__(self.home / "prometheus.log")
        jobs = [
            {"job_name": job, "static_configs": [{"targets": [target]}]}
            for job, target in targets.items()
        ]
        interval = f"{SCRAPE_INTERVAL:g}s"
        config = {
            "global": {"scrape_interval": interval, "scrape_timeout": interval},
            "scrape_configs": jobs,
        }
        # JSON is YAML: no writer needed.
        (self.home / "prometheus.yml").write_text(json.dumps(config, indent=2))

    def __enter__(self) -> Prometheus:
        args = [
            "timeout", str(LIFETIME), self.binary,
            f"--config.file={self.home / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.home / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]  # fmt: skip
        self.start(args, self.home)
        return self

    def api(self, path: str, **params: str | float) -> Any:
        """``/api/v1/<path>``'s data; a query Prometheus refuses fails with its error."""
        query = urllib.parse.urlencode({k: str(v) for k, v in params.items()})
        try:
            url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{query}"
            with urllib.request.urlopen(url, timeout=10) as got:
                answer = json.loads(got.read())
        except urllib.error.HTTPError as error:
            raise AssertionError(f"{params}: {error.read().decode()}") from None
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector at this moment."""
        found: list[dict[str, Any]] = self.api("query", query=expr)["result"]
        return found

    def query_range(
        self, expr: str, start: float, end: float, step: float = SCRAPE_INTERVAL
    ) -> list[dict[str, Any]]:
        """A range query's matrix: each series' labels (``metric``) and [time, text] values."""
        found: list[dict[str, Any]] = self.api(
            "query_range", query=expr, start=start, end=end, step=step
        )["result"]
        return found

    def scraped_after(self, moment: float) -> bool:
        """Whether every target's last scrape began after ``moment`` (a Unix time) and
        succeeded: it saw everything counted before."""
        targets = self.query("up")
        last = self.query("timestamp(up == 1)")
        return len(last) == len(targets) > 0 and all(float(t["value"][1]) > moment for t in last)

    def wait_scraped(self, after: float, what: str = "a scrape of each target") -> None:
        """Until every target's last scrape began after ``after`` (``scraped_after``)."""
        wait_for(lambda: self.scraped_after(after), 30, what)

    def __exit__(self, *_: object) -> None:
        self.stop()
        shutil.rmtree(self.home, ignore_errors=True)
