"""A task's idempotency options: where a call's key comes from, how long it keeps its first call.

Any singleton task takes ``apply_async(..., idempotency_key=k)``; the task option
``singleton={"idempotency": {...}}`` sets the window, ``keep_failures`` and ``key_from`` (a
task parameter, or ``"header:<name>"``, so a key travels without each caller passing it).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

from .._time import ttl_to_ms
from ..exceptions import ConfigurationError
from ..keys import KeySpec
from ..lease.idempotency import check_key

logger = logging.getLogger(__name__)

DEFAULT_WINDOW = 24 * 3600.0  # a day, as Stripe keeps keys
HEADER = "header:"
# Its own options, written inside it: idempotency={"keep_failures": True}.
IDEMPOTENCY_OPTIONS = ("key_from", "window", "keep_failures")


@dataclass(frozen=True)
class Idempotency:
    """How one task's calls use idempotency keys (``refused``: why they cannot)."""

    window: float = DEFAULT_WINDOW
    keep_failures: bool = False
    key_from: str | None = None  # a parameter's name, or "header:<name>"
    given: bool = False  # the task asked for it (its option), not only a call's key
    refused: str | None = None

    @property
    def window_ms(self) -> int:
        return round(self.window * 1000)

    def key_of(
        self,
        task: str,
        spec: KeySpec,
        args: Sequence[object],
        kwargs: Mapping[str, object],
        headers: Mapping[str, object] | None,
    ) -> str | None:
        """The call's key as ``key_from`` finds it (None: this call has none)."""
        source = self.key_from
        if source is None:
            return None
        if source.startswith(HEADER):
            value = (headers or {}).get(source[len(HEADER) :])
        else:
            value = spec.argument(source, args, kwargs)
        return None if value is None else self.checked(task, value)

    def checked(self, task: str, key: object) -> str:
        """``key`` if this task may take it, else the error that says what to do."""
        if self.refused is not None:
            raise ConfigurationError(f"{task}: idempotency_key= {self.refused}")
        return check_key(key)


def idempotency_option(task: str, value: object, spec: KeySpec, refused: str | None) -> Idempotency:
    """``singleton={"idempotency": value}`` checked; ``refused``: why this task's mode
    cannot take keys (``contradictions.idempotency_refused``), said at a call with one."""
    if value is None or value is False:
        return Idempotency(refused=refused)
    if value is True:
        value = {}
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"{task}: idempotency={value!r} must be True or a dict, e.g. "
            "idempotency={'key_from': 'header:Idempotency-Key', 'window': 3600}"
        )
    unknown = sorted(set(value) - set(IDEMPOTENCY_OPTIONS), key=str)
    if unknown:
        raise ConfigurationError(
            f"{task}: idempotency option(s) {unknown} unknown; allowed: {list(IDEMPOTENCY_OPTIONS)}"
        )
    window = ttl_to_ms(  # a record, not a lease: nothing waits on it, it may outlast a day
        value.get("window", DEFAULT_WINDOW), what=f"{task}: idempotency window", allow_long=True
    )
    keep = value.get("keep_failures", False)
    if not isinstance(keep, bool):
        raise ConfigurationError(f"{task}: keep_failures must be True or False, got {keep!r}")
    source = value.get("key_from")
    if source is not None:
        if not isinstance(source, str) or not source or source == HEADER:
            raise ConfigurationError(
                f"{task}: key_from={source!r} must name a parameter of the task or a "
                "header, e.g. key_from='request_id' or key_from='header:Idempotency-Key'"
            )
        if not source.startswith(HEADER):
            spec.check_parameter(source, f"idempotency key_from={source!r}")
    return Idempotency(window / 1000, keep, source, given=True)


def warn_if_results_are_short(
    task: str, options: Idempotency, conf: Mapping[str, object], ignore_result: bool
) -> None:
    """At decoration: say when a repeat could not read the first call's result (``conf``:
    the app's Celery settings)."""
    if options.given:
        _say_if_short(task, options, conf, ignore_result)


# Tasks whose first call with a key of its own was checked (their options name no keys).
_checked_at_call: set[str] = set()


def warn_once_for_call_keys(
    task: str, options: Idempotency, conf: Mapping[str, object], ignore_result: bool
) -> None:
    """At a task's first call with ``idempotency_key=`` when its options declare no keys
    (so decoration said nothing): the same warning, once per task and process."""
    if options.given or task in _checked_at_call:
        return
    _checked_at_call.add(task)
    _say_if_short(task, options, conf, ignore_result)


def _say_if_short(
    task: str, options: Idempotency, conf: Mapping[str, object], ignore_result: bool
) -> None:
    backend = str(conf.get("result_backend") or "")
    expires = conf.get("result_expires")
    result_expires = expires.total_seconds() if isinstance(expires, timedelta) else expires
    eager_unstored = bool(conf.get("task_always_eager")) and not conf.get("task_store_eager_result")
    if ignore_result:
        why = "ignore_result is set, so a repeat of an idempotency key gets the first call's "
        fix = "task id but never its result; unset ignore_result to answer repeats"
    elif backend.startswith(("rpc", "amqp")):
        why = "the rpc:// result backend sends a result to its caller alone, so a repeat "
        fix = "from another process never gets it; use a result backend that stores results"
    elif eager_unstored:
        why = "task_always_eager without task_store_eager_result stores no result, so a "
        fix = "repeat's result never comes; set task_store_eager_result=True"
    elif isinstance(result_expires, int | float) and 0 < result_expires < options.window:
        why = (
            f"result_expires ({result_expires:g}s) is shorter than the idempotency window "
            f"({options.window:g}s): a repeat after the result expired cannot read it; "
        )
        fix = "raise result_expires or shorten the window"
    else:
        return
    logger.warning("%s: %s%s", task, why, fix)
