"""The incumbents' option and setting names, and typos of ours, with what to write instead.

Celery accepts any unknown task or ``apply_async`` keyword, so ``unique_on=[...]`` ported from
celery-singleton, or ``once={...}`` from celery-once, would do nothing: the task would lock on
all its arguments, the dedupe gone without a word. These names are refused where written.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from celery.app.utils import Settings


# Task options of celery-singleton and celery-once -> what to write here instead. Celery
# would make an unknown task keyword a class attribute, an unknown apply_async one a
# message property.
FOREIGN_OPTIONS = {
    "unique_on": "key=[...] with the same parameter names (e.g. key=['table_id'])",
    "once": (
        "key=[...] for once['keys']; on_duplicate='raise' for the default (graceful=False) "
        "or on_duplicate='return' for graceful=True; lock='until_executing' for "
        "unlock_before_run=True; ttl= / queue_ttl= for timeout"
    ),
    "raise_on_duplicate": "on_duplicate='raise' (the default, 'return', gives the holder's result)",
    "lock_expiry": (
        "nothing in its place: the lease is renewed while the task runs and freed within "
        "ttl= when its worker dies; for at most one accepted call per period write "
        "throttle=<seconds>"
    ),
}
# App settings of the incumbents (as app.conf keys, lower case, without Django's CELERY_).
FOREIGN_SETTINGS = {
    "once": (
        "singleton_lock_url for ONCE['settings']['url'] (default_timeout has no "
        "equivalent: leases are renewed while a task runs; singleton_lock_queue_ttl bounds "
        "how long a queued call holds its key)"
    ),
    "singleton_backend_url": "singleton_lock_url",
    "singleton_key_prefix": "singleton_lock_prefix",
    "singleton_raise_on_duplicate": "the task option on_duplicate='raise'",
    "singleton_lock_expiry": (
        "singleton_lock_ttl (how long a dead worker's lease outlives it; a running task's "
        "lease is renewed), or throttle= on the task"
    ),
}
_CUTOFF = 0.75  # difflib ratio: 'dedup', 'keys', 'on_contentions' match; 'queue' does not


def explain_unknown(name: str, known: Sequence[str]) -> str | None:
    """What to write instead of option ``name``: a foreign option's equivalent, or the
    option of ours it is a typo of (None when it looks like neither)."""
    if name in FOREIGN_OPTIONS:
        return f"{name}= is not an option here; write {FOREIGN_OPTIONS[name]}"
    close = difflib.get_close_matches(name, known, n=1, cutoff=_CUTOFF)
    return f"{name}= is not an option; did you mean {close[0]}=?" if close else None


def foreign_settings(conf: Settings) -> list[str]:
    """Warnings for the incumbents' app settings, each naming the setting to use instead."""
    warnings = []
    for key in list(conf.keys()):
        written = str(key)
        name = written.lower()
        if name.startswith("celery_") and name[len("celery_") :] in FOREIGN_SETTINGS:
            name = name[len("celery_") :]
        if name in FOREIGN_SETTINGS and conf.get(key) is not None:
            instead = FOREIGN_SETTINGS[name]
            if written.startswith("CELERY_"):  # Django's namespace: name ours the same way
                instead = _OUR_SETTING.sub(lambda m: "CELERY_" + m.group(0).upper(), instead)
            warnings.append(
                f"{written} is a setting of another library and is ignored here; use {instead}"
            )
    return warnings


_OUR_SETTING = re.compile(r"singleton_lock_[a-z_]+")
