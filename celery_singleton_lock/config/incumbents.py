"""The incumbents' option and setting names, and typos of ours, with what to write instead.

Celery accepts any unknown task or ``apply_async`` keyword, so ``unique_on=[...]`` ported from
celery-singleton, ``once={...}`` from celery-once or ``keep_failures=`` outside ``idempotency=``
would do nothing (a dedupe gone, a failure run again) without a word: refused where written.
"""

from __future__ import annotations

import difflib
import re
import reprlib
from collections.abc import Mapping, Sequence
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


def explain_unknown(
    name: str,
    value: object,
    known: Sequence[str],
    nested: Mapping[str, str] | None = None,
    *,
    top: bool = True,
) -> str | None:
    """What to write instead of option ``name=value``: a foreign option's equivalent, the
    option an option of ours goes inside (``nested``: its name -> that option), or the
    option of ours it is a typo of (None when it looks like neither). ``top``: it was a
    keyword of ``@singleton_task``, else a class attribute or in ``singleton={...}``."""
    nested = nested or {}
    if name in FOREIGN_OPTIONS:
        return f"{name}= is not an option here; write {FOREIGN_OPTIONS[name]}"
    if name in nested:
        return f"{name} is {_inside(name, nested[name], value, top)}"
    # A near miss of a nested name only among the decorator's keywords: a class attribute
    # of the user's own (``windows``, ``max_window``) is not taken for one.
    candidates = [*known, *nested] if top else list(known)
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=_CUTOFF)
    if not close:
        return None
    meant = close[0]
    if meant in nested:
        where = _inside(meant, nested[meant], value, top)
        return f"{name}= is not an option; did you mean {meant}? {meant} is {where}"
    return f"{name}= is not an option; did you mean {meant}=?"


def _inside(name: str, parent: str, value: object, top: bool) -> str:
    """Where option ``name`` of option ``parent`` is written, with ``value``."""
    shown = _SHOWN.repr(value)
    inside = f"{{{name!r}: {'...' if '...' in shown else shown}}}"  # cut short: not Python
    written = (
        f"@singleton_task({parent}={inside})" if top else f"singleton={{{parent!r}: {inside}}}"
    )
    return f"an option of {parent}=...: write {written}"


# A value quoted in a message: bounded, whatever a task attribute holds.
_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 60


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
