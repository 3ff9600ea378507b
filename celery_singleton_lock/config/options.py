"""A singleton task's own options (key, lock scope, throttle, ...), checked at decoration."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from celery import Task

from .._time import ttl_to_ms
from ..exceptions import ConfigurationError
from ..keys import KeySpec
from ..modes import Chosen, Mode, RateSpec, lock_scopes, own_options, pick, settle
from ..policies import ContentionPolicy, OnDuplicate, contention_policy, on_duplicate_option
from .contradictions import Given, check, idempotency_refused
from .idempotency_options import IDEMPOTENCY_OPTIONS, Idempotency, idempotency_option
from .incumbents import FOREIGN_OPTIONS, explain_unknown
from .limit_options import (
    limit_option,
    max_pending_option,
    rate_option,
    slotted_limit,
    total_limit_option,
)

# The options the modes add, each read by its mode's reader (``modes.choosing.Choice``).
MODE_OPTIONS = own_options()
OPTION_NAMES = (
    "key",
    "lock",
    "limit",
    "on_duplicate",
    "on_contention",
    "ttl",
    "queue_ttl",
    "dedupe",
    "reopen_on",
    "rate",
    "burst",
    "cost",
    "on_limited",
    "max_pending",
    "total_limit",
    "history",
    "idempotency",
    *MODE_OPTIONS,
)
# The ends of a run after which its key takes the next call at once (``reopen_on``).
REOPEN_ENDS = ("failure", "revoked")
# How long a call keeps its duplicates out (sidekiq-unique-jobs' lock types), each a
# mode's: until_executed, while queued and while running (the default); until_executing,
# while queued only; while_executing, never at dispatch (dedupe=False).
LOCK_SCOPES = lock_scopes()


@dataclass(frozen=True)
class SingletonOptions:
    """A task's singleton options, validated when the task class is created."""

    key: KeySpec
    lock: str
    limit: int | None  # executions at once per key, in slots (1 only with total_limit)
    on_duplicate: OnDuplicate
    on_contention: ContentionPolicy
    ttl: float | None
    queue_ttl: float | None
    dedupe: bool
    # The modes' own options as read, by name (``Choice.reads``: throttle, debounce, ...).
    own: Mapping[str, object]
    reopen_on: frozenset[str] = frozenset()
    rate: RateSpec | None = None  # runs started per key per period, across workers
    max_pending: int | None = None  # calls of a key waiting at once (with rate or limit)
    total_limit: int | None = None  # runs of the task at once across keys (with limit)
    history: bool | None = None  # keep each lock's history (None: the app's setting says)
    idempotency: Idempotency = field(default_factory=Idempotency)  # calls' idempotency keys

    @classmethod
    def build(
        cls,
        name: str,
        run: Callable[..., object] | staticmethod[..., object],
        raw: Mapping[str, object] | None,
    ) -> SingletonOptions:
        if raw is not None and not isinstance(raw, Mapping):
            raise ConfigurationError(
                f"{name}: singleton={raw!r} must be a dict of options, e.g. "
                "singleton={'key': ['order_id']}"
            )
        raw = dict(raw or {})
        unknown = sorted(set(raw) - set(OPTION_NAMES), key=str)
        if unknown:
            hints = [
                explain_unknown(str(option), raw[option], OPTION_NAMES, NESTED_OPTIONS, top=False)
                for option in unknown
            ]
            raise ConfigurationError(
                f"{name}: unknown singleton option(s) {unknown}"
                + "".join(f"; {hint}" for hint in hints if hint)
                + f"; allowed: {list(OPTION_NAMES)}"
            )
        if isinstance(run, staticmethod):
            func, bound = run.__func__, False
        else:
            func, bound = run, True
        limit = limit_option(name, raw)
        rate = rate_option(name, raw)
        own = {option: read(raw, option, name) for option, read in MODE_OPTIONS.items()}
        if limit is not None or rate is not None:
            lock = "while_executing"  # every call is sent; the runs are what is limited
        else:
            lock = _lock_scope(name, raw)
        on_duplicate = on_duplicate_option(raw.get("on_duplicate", "return"))
        # What the modes' own options settle (a debounce's scope and answer): the
        # contradictions, the idempotency check and the pick see the options so.
        read = settle(Chosen(name, lock, on_duplicate, values={**own, "limit": limit}))
        lock, on_duplicate = read.lock, on_duplicate_option(read.on_duplicate)
        key = KeySpec(func, name=name, key=raw.get("key"), bound=bound)
        refused = idempotency_refused(read)
        total_limit = total_limit_option(name, raw)
        on_contention = contention_policy(raw.get("on_contention", "requeue"))
        ttl = _seconds(raw.get("ttl"), f"{name}: ttl")
        queue_ttl = _seconds(raw.get("queue_ttl"), f"{name}: queue_ttl")
        reopen_on = _reopen_on(name, raw)
        max_pending = max_pending_option(name, raw)
        history = _history_option(name, raw.get("history"))
        idempotency = idempotency_option(name, raw.get("idempotency"), key, refused)
        given = Given(
            raw=raw,
            lock=lock,
            on_duplicate=on_duplicate,
            limit=limit,
            values=own,
            total_limit=total_limit,
            reopen_on=reopen_on,
            max_pending=max_pending,
            idempotency=refused if idempotency.given else None,
        )
        check(name, given)  # what cannot go together, with what to write instead
        return cls(
            key=key,
            lock=lock,
            limit=slotted_limit(limit, total_limit),
            on_duplicate=on_duplicate,
            on_contention=on_contention,
            ttl=ttl,
            queue_ttl=queue_ttl,
            dedupe=lock != "while_executing",
            own=own,
            reopen_on=reopen_on,
            rate=rate,
            max_pending=max_pending,
            total_limit=total_limit,
            history=history,
            idempotency=idempotency,
        )

    @property
    def chosen(self) -> Chosen:
        """These options as the modes' choices see them (``modes.choosing.Chosen``)."""
        limits = {"limit": self.limit, "total_limit": self.total_limit, "rate": self.rate}
        values = {**self.own, **limits}
        return Chosen(self.key.name, self.lock, self.on_duplicate, self.reopen_on, values)

    @cached_property
    def mode(self) -> Mode:
        """The lock type these options choose (``modes.pick``): what each stage of a call
        does. The one place options become a mode; nothing after it branches on them."""
        return pick(self.chosen)

    # The modes' own options, as the locks page shows them (``contrib.web.views``).

    @property
    def throttle(self) -> float | None:
        return _seconds_read(self.own.get("throttle"))

    @property
    def debounce(self) -> float | None:
        return _seconds_read(self.own.get("debounce"))

    @property
    def max_wait(self) -> float | None:
        return _seconds_read(self.own.get("max_wait"))

    @property
    def terminate_on_cancel(self) -> bool:
        """Whether a cancelled run's prefork child is terminated (``run.cancels``)."""
        return self.own.get("terminate_on_cancel") is True and self.on_duplicate == "cancel"


def _seconds_read(value: object) -> float | None:
    return value if isinstance(value, float) else None


def _reopen_on(name: str, raw: Mapping[str, object]) -> frozenset[str]:
    value = raw.get("reopen_on", ())
    ends = (value,) if isinstance(value, str) else value
    if not isinstance(ends, Iterable) or not all(isinstance(e, str) for e in ends):
        raise ConfigurationError(
            f"{name}: reopen_on={value!r} must name run ends, e.g. reopen_on=('failure',)"
        )
    chosen = frozenset(ends)
    unknown = sorted(chosen - set(REOPEN_ENDS))
    if unknown:
        raise ConfigurationError(
            f"{name}: reopen_on={value!r}: {unknown} is not a run end; choose from "
            f"{list(REOPEN_ENDS)}"
        )
    return chosen


# Celery's own task attributes (read from the classes: hasattr() on a deprecated one warns),
# and the keywords its decorator takes that are not attributes (task(), _task_from_fun(),
# the autoretry options): never refused, never taken for a typo of ours.
_CELERY_NAMES = frozenset(name for klass in Task.__mro__ for name in vars(klass)) | {
    *("shared", "filter", "lazy", "base", "bind"),
    *("pydantic", "pydantic_strict", "pydantic_context", "pydantic_dump_kwargs"),
    *("autoretry_for", "dont_autoretry_for", "retry_kwargs"),
    *("retry_backoff", "retry_backoff_max", "retry_jitter"),
}
# Options that are only valid inside another one -> that option. At the top level Celery
# would keep one as a task attribute that does nothing (keep_failures=True: a repeat
# after a failure would run again).
NESTED_OPTIONS = dict.fromkeys(IDEMPOTENCY_OPTIONS, "idempotency")


def refuse_task_options(task: str, given: Mapping[str, object], *, misplaced: bool = False) -> None:
    """Refuse the incumbents' options, typos of ours and options that go inside another
    among a task's Celery keywords (``given``: name -> value).

    ``misplaced``: they are class attributes of an ``@app.task(base=SingletonTask, ...)``
    task, where our own options belong in ``singleton={...}``.
    """
    problems = []
    for name, value in given.items():
        if name.startswith("_") or name == "singleton":
            continue
        if misplaced and name in OPTION_NAMES:
            problems.append(f"{name}= belongs in singleton={{{name!r}: ...}}")
        elif name in FOREIGN_OPTIONS or name not in _CELERY_NAMES:
            hint = explain_unknown(name, value, OPTION_NAMES, NESTED_OPTIONS, top=not misplaced)
            if hint:
                problems.append(hint)
    if problems:
        raise ConfigurationError(f"{task}: {'; '.join(problems)}")


# What one call must not carry: the incumbents' options, and task options misplaced.
_NOT_PER_CALL = frozenset({*FOREIGN_OPTIONS, "singleton", *OPTION_NAMES} - {"dedupe"})


def refuse_call_options(task: str, options: Mapping[str, object]) -> None:
    """Refuse singleton options of one ``apply_async`` call before anything is sent:
    Celery would send them as message properties that do nothing."""
    for name in options:
        if name in _NOT_PER_CALL or ("dedup" in name and name != "dedupe"):
            if name in FOREIGN_OPTIONS:
                instead = f"{FOREIGN_OPTIONS[name]}, on the task"
            elif name in _NOT_PER_CALL:
                instead = f"{name}= on the task (the decorator); a call takes only dedupe=False"
            else:
                instead = "dedupe=False (the one per-call option)"
            raise ConfigurationError(
                f"{task}: apply_async({name}=...) is not a per-call option; write {instead}"
            )
    dedupe = options.get("dedupe", True)
    if not isinstance(dedupe, bool):
        raise ConfigurationError(
            f"{task}: apply_async(dedupe={dedupe!r}): dedupe is True (the default) or False"
        )


def _lock_scope(name: str, raw: Mapping[str, object]) -> str:
    """``lock=``, reconciled with the older ``dedupe=`` (False means while_executing)."""
    dedupe = raw.get("dedupe", True)
    if not isinstance(dedupe, bool):
        raise ConfigurationError(f"{name}: dedupe must be True or False, got {dedupe!r}")
    if "lock" not in raw:
        return "until_executed" if dedupe else "while_executing"
    lock = raw["lock"]
    if lock not in LOCK_SCOPES:
        raise ConfigurationError(
            f"{name}: lock={lock!r} is not a lock scope; use one of {list(LOCK_SCOPES)}"
        )
    return str(lock)  # with a dedupe= that says otherwise: ``contradictions``


def _seconds(value: object, what: str) -> float | None:
    return None if value is None else ttl_to_ms(value, what=what) / 1000


def is_singleton(task: object) -> bool:
    """Whether ``task`` is a singleton task (has singleton options), without importing it.

    The worker's modules ask this of Celery's tasks and requests; naming ``SingletonTask``
    there would tie them to the execution module, which connects them.
    """
    return callable(getattr(task, "singleton_options", None))


def _history_option(name: str, value: object) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise ConfigurationError(f"{name}: history={value!r}: use True or False (or leave it out)")
