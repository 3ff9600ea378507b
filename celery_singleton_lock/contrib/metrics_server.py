"""A worker's metrics endpoint: its main process serves its pool children's figures too.

Prometheus's multiprocess mode (files per process, the dead ones dropped as they are read)
is set before the pool forks, so every child counts where the main process reads.
"""

from __future__ import annotations

import os
import sys
import tempfile

from ..exceptions import ConfigurationError
from .metrics import install, installed, prometheus, show_ride_outcomes
from .metrics_files import LiveOnly


def serve_worker(port: object, addr: object = "127.0.0.1") -> int:
    """In a worker's main process, before its pool starts: count into Prometheus's
    multiprocess files (the children inherit the mode) and serve them all on ``port``.
    The files go in a directory made for the worker unless ``PROMETHEUS_MULTIPROC_DIR``
    names one.

    Returns the port served (a free one when ``port`` is 0).
    """
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ConfigurationError(f"singleton_lock_metrics_port must be a port number, got {port!r}")
    if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        if "prometheus_client" in sys.modules and installed():
            # Its value class is chosen as a metric is made: ours are made already.
            raise ConfigurationError(
                "prometheus_client was imported before the worker started its metrics: set "
                "PROMETHEUS_MULTIPROC_DIR to an empty directory in the worker's environment"
            )
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="csl-metrics-")
        if "prometheus_client" in sys.modules:
            # Imported already (celery's command line loads its plugins' commands, Flower's
            # among them, which imports it): its value class, chosen at import, is chosen
            # again before ours are made.
            from prometheus_client import values  # noqa: PLC0415

            values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
    prom = prometheus()
    install()
    show_ride_outcomes()
    registry = prom.CollectorRegistry()
    registry.register(LiveOnly(os.environ["PROMETHEUS_MULTIPROC_DIR"]))
    server, _ = prom.start_http_server(port, addr=str(addr), registry=registry)
    served: int = server.server_port
    return served


__all__ = ["serve_worker"]
