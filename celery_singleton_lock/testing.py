"""Moved to ``celery_singleton_lock.contrib.testing``; this import path goes in the next release."""

import warnings

from .contrib.testing import *  # noqa: F403  (the moved module, whole)

warnings.warn(
    "celery_singleton_lock.testing moved to celery_singleton_lock.contrib.testing; import it "
    "from there",
    DeprecationWarning,
    stacklevel=2,
)
