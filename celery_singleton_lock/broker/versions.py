"""The kombu and Celery releases the ride is tested on.

The ride subclasses kombu's Redis channel, its unacked bookkeeping and Celery's Redis result
backend, and writes kombu's layout: a release that changes any of those could lose a message.
So it installs only on the releases CI runs; elsewhere each lock operation has its own round trip.
"""

from __future__ import annotations

import functools
import importlib
import logging
import re

logger = logging.getLogger(__name__)

# [first, below): the releases the ride is tested on (the CI matrix's oldest and newest,
# each with tests/unit/test_broker_contract.py): a release that changes kombu's layout
# could make a message skip kombu's bookkeeping or land where no consumer reads. Raise the
# upper bound only with a CI run of the contract tests and the matrix on the new release.
TESTED = {
    "kombu": ((5, 3), (5, 8)),
    "celery": ((5, 3), (5, 8)),
}


@functools.cache  # asked at every singleton task's binding
def installed(package: str) -> str:
    """The release of ``package`` this process runs (its ``__version__``: there even
    where no distribution metadata was installed)."""
    return str(getattr(importlib.import_module(package), "__version__", ""))


def _minor(release: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a release string; a pre-release of 5.8 is 5.8."""
    found = re.match(r"(\d+)\.(\d+)", release)
    return None if found is None else (int(found.group(1)), int(found.group(2)))


def _shown(minor: tuple[int, int]) -> str:
    return ".".join(map(str, minor))


def outside() -> str | None:
    """Why the ride must not install here (a release outside ``TESTED``); None when
    every release is inside."""
    for package, (first, below) in TESTED.items():
        release = installed(package)
        minor = _minor(release)
        if minor is None or not first <= minor < below:
            return (
                f"{package} {release or '(unknown)'} is outside the releases the broker ride is "
                f"tested on ({package} >= {_shown(first)}, < {_shown(below)}): every lock "
                "operation takes a "
                "round trip of its own (correct, a little slower). Install a tested release, "
                "or upgrade celery-singleton-lock, to ride the broker's round trips again"
            )
    return None


# Whether the releases this process runs are inside ``TESTED``: what the run-time paths
# ask (a task's end among them), once.
TESTED_HERE = outside() is None


@functools.cache
def warn_once(reason: str) -> None:
    """One WARNING per process and reason, however many apps and tasks ask."""
    logger.warning("celery-singleton-lock: %s", reason)
