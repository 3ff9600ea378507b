"""Moved to ``celery_singleton_lock.contrib.metrics``; this import path goes in the next release."""

import warnings

from .contrib.metrics import *  # noqa: F403  (the moved module, whole)

warnings.warn(
    "celery_singleton_lock.metrics moved to celery_singleton_lock.contrib.metrics; import it "
    "from there",
    DeprecationWarning,
    stacklevel=2,
)
