"""Setting names as the app spells them: a misspelt one refused, messages in the app's spelling.

A ``singleton_lock_*`` key we do not know is refused with the closest of ours; an error
names a setting as the app writes it (``CELERY_SINGLETON_LOCK_TTL`` under Django).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection
from typing import TYPE_CHECKING

from ..exceptions import ConfigurationError

if TYPE_CHECKING:
    from celery.app.utils import Settings


def refuse_unknown_keys(conf: Settings, known: Collection[str], foreign: Collection[str]) -> None:
    """Refuse a ``singleton_lock_*`` key of ``conf`` that is neither ``known`` (ours) nor
    ``foreign`` (another library's that shares the prefix), suggesting the closest of ours."""
    # Named as the user wrote them: CELERY_SINGLETON_LOCK_TLL in a Django settings.py
    # (namespace "CELERY"), singleton_lock_tll in a celeryconfig.
    unknown: dict[str, str] = {}  # as written -> our name
    for key in list(conf.keys()):
        written = str(key)
        lowered = written.lower()
        for prefix in ("celery_singleton_lock_", "singleton_lock_"):
            if lowered.startswith(prefix):
                name = "singleton_lock_" + lowered[len(prefix) :]
                if name not in known and name not in foreign:
                    unknown[written] = name
                break
    if not unknown:
        return
    described = []
    for written, name in sorted(unknown.items()):
        hint = difflib.get_close_matches(name, list(known), n=1)
        described.append(
            f"{written} (did you mean {_as_written(hint[0], written)}?)" if hint else written
        )
    listed = sorted(_as_written(n, next(iter(unknown))) for n in known)
    raise ConfigurationError(
        f"unknown setting {', '.join(described)}; known settings are {', '.join(listed)}"
    )


_OUR_NAME = re.compile(r"(?<![A-Za-z_])singleton_lock_[a-z_]+")


def in_users_words(message: str, conf: Settings) -> str:
    """``message`` with our setting names spelt as the app's settings spell them."""
    like = next(
        (str(k) for k in list(conf.keys()) if str(k).lower().startswith("celery_singleton_lock_")),
        None,
    )
    if like is None:
        return message
    return _OUR_NAME.sub(lambda found: _as_written(found.group(0), like), message)


def _as_written(name: str, like: str) -> str:
    """Our setting ``name`` spelt the way ``like`` was (its namespace and case)."""
    head = like[: len("celery_")] if like.lower().startswith("celery_singleton_lock_") else ""
    spelt = head + name
    return spelt.upper() if like.isupper() else spelt
