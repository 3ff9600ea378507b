"""A singleton task's own options (key, on_duplicate, on_contention, ...), checked at decoration."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._time import ttl_to_ms
from .exceptions import ConfigurationError
from .keys import KeySpec
from .policies import ContentionPolicy, OnDuplicate, contention_policy, on_duplicate_option

OPTION_NAMES = ("key", "on_duplicate", "on_contention", "ttl", "queue_ttl", "dedupe")


@dataclass(frozen=True)
class SingletonOptions:
    """A task's singleton options, validated when the task class is created."""

    key: KeySpec
    on_duplicate: OnDuplicate
    on_contention: ContentionPolicy
    ttl: float | None
    queue_ttl: float | None
    dedupe: bool

    @classmethod
    def build(cls, name: str, run: Any, raw: Mapping[str, Any] | None) -> SingletonOptions:
        raw = dict(raw or {})
        unknown = sorted(set(raw) - set(OPTION_NAMES))
        if unknown:
            raise ConfigurationError(
                f"{name}: unknown singleton option(s) {unknown}; allowed: {list(OPTION_NAMES)}"
            )
        if isinstance(run, staticmethod):
            func, bound = run.__func__, False
        else:
            func, bound = run, True
        dedupe = raw.get("dedupe", True)
        if not isinstance(dedupe, bool):
            raise ConfigurationError(f"{name}: dedupe must be True or False, got {dedupe!r}")
        return cls(
            key=KeySpec(func, name=name, key=raw.get("key"), bound=bound),
            on_duplicate=on_duplicate_option(raw.get("on_duplicate", "return")),
            on_contention=contention_policy(raw.get("on_contention", "requeue")),
            ttl=_seconds(raw.get("ttl"), f"{name}: ttl"),
            queue_ttl=_seconds(raw.get("queue_ttl"), f"{name}: queue_ttl"),
            dedupe=dedupe,
        )


def _seconds(value: object, what: str) -> float | None:
    return None if value is None else ttl_to_ms(value, what=what) / 1000


def is_singleton(task: object) -> bool:
    """Whether ``task`` is a singleton task (has singleton options), without importing it.

    The worker's modules ask this of Celery's tasks and requests; naming ``SingletonTask``
    there would tie them to the execution module, which connects them.
    """
    return callable(getattr(task, "singleton_options", None))
