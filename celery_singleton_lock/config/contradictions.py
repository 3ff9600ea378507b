"""Which task options cannot go together, and what to write instead: one table, checked once.

Each option's own value is checked where it is read (``options``, ``limit_options``, ...);
the rows here see the options once read. The first row that applies is the error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..exceptions import ConfigurationError
from ..modes import Chosen

# The answers to a duplicate that need a call queued to swap into (their own rows say so).
REPLACING = ("replace", "cancel")


@dataclass(frozen=True)
class Given:
    """A task's options as written (``raw``) and as read, for the rows to look at."""

    raw: Mapping[str, object]
    # The lock scope they come to (limit=, rate=: while_executing; debounce, cancel:
    # until_executing).
    lock: str
    on_duplicate: str  # the answer they come to (debounce: replace)
    limit: int | None  # as written (limit=1 too)
    values: Mapping[str, object]  # the modes' own options as read (``Choice.reads``)
    total_limit: int | None
    reopen_on: frozenset[str]
    max_pending: int | None
    # Why the mode cannot take idempotency keys (``idempotency_refused``), if it asks for them.
    idempotency: str | None = None

    @property
    def throttle(self) -> float | None:
        return _seconds(self.values.get("throttle"))

    @property
    def debounce(self) -> float | None:
        return _seconds(self.values.get("debounce"))

    @property
    def max_wait(self) -> float | None:
        return _seconds(self.values.get("max_wait"))


@dataclass(frozen=True)
class Contradiction:
    """One forbidden combination: as ``docs/modes.md`` lists it (``listed``), ``when`` it
    applies, and the ``message`` (after the task's name) that says what to write instead."""

    listed: str
    when: Callable[[Given], bool]
    message: Callable[[Given], str]


def check(task: str, given: Given) -> None:
    """Raise ``ConfigurationError`` for the first row of ``CONTRADICTIONS`` that applies."""
    for row in CONTRADICTIONS:
        if row.when(given):
            raise ConfigurationError(f"{task}: {row.message(given)}")


def idempotency_refused(read: Chosen) -> str | None:
    """Why a mode cannot take idempotency keys (None: it can), given the options ``read``
    (and settled): said at decoration when the task asks for keys, and at a call that
    passes one.

    A key promises the first call's answer to every repeat; these modes let a newer
    call replace or cancel an older one, or run beside it.
    """
    debounce, on_duplicate, limit = read.value("debounce"), read.on_duplicate, read.value("limit")
    if debounce is not None or on_duplicate in REPLACING:
        how = "debounce" if debounce is not None else f"on_duplicate={on_duplicate!r}"
        return (
            f"cannot be used with {how}: a newer call replaces or cancels the first, so a "
            "repeat could not get the first call's answer; use the default lock scope "
            "(or throttle, rate) with idempotency keys"
        )
    if isinstance(limit, int) and limit > 1:
        return (
            f"cannot be used with limit={limit}: a copy of a call could run beside it; use "
            "the default lock scope (or rate=) with idempotency keys"
        )
    return None


def _seconds(value: object) -> float | None:
    return value if isinstance(value, float) else None


def _dispatch_options(raw: Mapping[str, object]) -> list[str]:
    """The options given that decide a call at dispatch: none apply where every call is
    sent (``limit=``, ``rate=``)."""
    clashes = [option for option in ("throttle", "on_duplicate", "debounce") if option in raw]
    if raw.get("lock", "while_executing") != "while_executing":
        clashes.append(f"lock={raw['lock']!r}")
    if raw.get("dedupe") is True:
        clashes.append("dedupe=True")
    return clashes


def _rate_shape(raw: Mapping[str, object]) -> list[str]:
    """The options that shape a rate, given without one."""
    if raw.get("rate") is not None:
        return []
    return [option for option in ("burst", "cost", "on_limited") if option in raw]


def _debounce_clashes(raw: Mapping[str, object]) -> list[str]:
    """What a debounce decides already: the second call's answer and the lock scope."""
    clashes = [option for option in ("throttle", "lock", "dedupe") if option in raw]
    if raw.get("on_duplicate", "replace") != "replace":
        clashes.append(f"on_duplicate={raw['on_duplicate']!r}")
    return clashes


def _cancel_clashes(raw: Mapping[str, object]) -> list[str]:
    """What cancel's one run and one pending call per key leave no room for."""
    clashes = [option for option in ("throttle", "reopen_on") if option in raw]
    if raw.get("lock", "until_executing") != "until_executing":
        clashes.append(f"lock={raw['lock']!r}")
    if raw.get("dedupe", True) is not True:
        clashes.append(f"dedupe={raw['dedupe']!r}")
    return clashes


def _given_with_throttle(raw: Mapping[str, object]) -> str:
    return f"lock={raw['lock']!r}" if "lock" in raw else f"dedupe={raw['dedupe']!r}"


def _every_call_sent(raw: Mapping[str, object]) -> str:
    return "dedupe=False" if "lock" not in raw else "lock='while_executing'"


def _queues_all_or_none(g: Given) -> str:
    return "throttle" if g.throttle is not None else "lock='while_executing'"


def _lock_and_dedupe_disagree(g: Given) -> bool:
    """``lock=`` and ``dedupe=`` both written, saying different things (only where no
    limit or rate sets the scope: those rows say it first)."""
    raw = g.raw
    if raw.get("limit") is not None or raw.get("rate") is not None:
        return False
    if "lock" not in raw or "dedupe" not in raw:
        return False
    return raw["dedupe"] != (raw["lock"] != "while_executing")


def _answer_never_used(g: Given) -> bool:
    """``on_duplicate`` given where every call is sent (replace and cancel say so themselves)."""
    answer = g.raw.get("on_duplicate")
    return g.lock == "while_executing" and answer is not None and answer not in REPLACING


def _reopen_changes_nothing(g: Given) -> bool:
    """``reopen_on`` where the key is free as a run starts or ends already."""
    if not g.reopen_on or g.throttle is not None:
        return False
    return g.lock != "until_executed" or g.on_duplicate == "replace"


# In the order the options were once checked one by one: where several apply, the first
# is said (the tests pin which).
CONTRADICTIONS: tuple[Contradiction, ...] = (
    Contradiction(
        (
            "`limit` with `throttle`, `on_duplicate`, `debounce`, `dedupe=True` or a lock "
            "scope other than `while_executing` (a limit refuses no call at dispatch)"
        ),
        lambda g: g.limit is not None and bool(_dispatch_options(g.raw)),
        lambda g: (
            f"limit={g.limit} with {', '.join(_dispatch_options(g.raw))}: a limit never "
            "refuses a call at dispatch (every call queues and at most limit run at once); "
            f"drop {', '.join(_dispatch_options(g.raw))}, or use a lock scope without limit"
        ),
    ),
    Contradiction(
        "`burst`, `cost` or `on_limited` without `rate`",
        lambda g: bool(_rate_shape(g.raw)),
        lambda g: (
            f"{' and '.join(_rate_shape(g.raw))} without rate: "
            f"{' and '.join(_rate_shape(g.raw))} shape a rate limit and do nothing alone; "
            "write rate='100/m' (or a callable of the task's arguments) with them, or drop "
            "them"
        ),
    ),
    Contradiction(
        (
            "`rate` with `throttle`, `on_duplicate`, `debounce`, `dedupe=True` or a lock "
            "scope other than `while_executing` (a rate never refuses a call at dispatch)"
        ),
        lambda g: g.raw.get("rate") is not None and bool(_dispatch_options(g.raw)),
        lambda g: (
            f"rate with {', '.join(_dispatch_options(g.raw))}: a rate never refuses a call "
            "at dispatch (every call is sent and each run waits for its slot); drop "
            f"{', '.join(_dispatch_options(g.raw))}, or drop rate (throttle=... accepts one "
            "call per window)"
        ),
    ),
    Contradiction(
        "`max_wait` without `debounce`",
        lambda g: g.debounce is None and g.max_wait is not None,
        lambda g: (
            "max_wait without debounce: max_wait bounds how long a debounce postpones a "
            "run; write debounce=... with it, or drop max_wait"
        ),
    ),
    Contradiction(
        "`max_wait` below `debounce`",
        lambda g: g.debounce is not None and g.max_wait is not None and g.max_wait < g.debounce,
        lambda g: (
            f"max_wait={g.max_wait:g} is below debounce={g.debounce:g}: a run could never "
            "wait for a quiet spell; make max_wait at least the debounce"
        ),
    ),
    Contradiction(
        (
            "`debounce` with `throttle`, `lock=`, `dedupe=` or an `on_duplicate` other than "
            '`"replace"`'
        ),
        lambda g: g.debounce is not None and bool(_debounce_clashes(g.raw)),
        lambda g: (
            f"debounce with {', '.join(_debounce_clashes(g.raw))}: debounce already decides "
            "the second call (it replaces the pending call's arguments and postpones it); "
            f"drop {', '.join(_debounce_clashes(g.raw))}"
        ),
    ),
    Contradiction(
        (
            "`lock=` with a `dedupe=` that says otherwise (`dedupe=False` is "
            '`lock="while_executing"`)'
        ),
        _lock_and_dedupe_disagree,
        lambda g: (
            f"lock={g.raw['lock']!r} with dedupe={g.raw['dedupe']!r} contradict each other "
            "(dedupe=False is lock='while_executing'); write lock= alone"
        ),
    ),
    Contradiction(
        "`throttle` with `lock=` or `dedupe=`",
        lambda g: g.throttle is not None and ("lock" in g.raw or "dedupe" in g.raw),
        lambda g: (
            f"throttle with {_given_with_throttle(g.raw)}: throttle decides which calls are "
            "accepted (one per window) and execution stays exclusive; write throttle=... "
            "alone, or a lock scope without throttle"
        ),
    ),
    Contradiction(
        (
            '`on_duplicate="raise"` or `"return"` with `lock="while_executing"` (it '
            "answers no call at dispatch)"
        ),
        _answer_never_used,
        lambda g: (
            f"on_duplicate={g.raw['on_duplicate']!r} with {_every_call_sent(g.raw)}: this "
            "lock scope checks nothing at dispatch (every call is sent; a copy meets "
            f"on_contention when it runs), so on_duplicate={g.raw['on_duplicate']!r} would "
            "never apply; drop on_duplicate, or use the default lock='until_executed' (or "
            "lock='until_executing') to answer a duplicate at dispatch"
        ),
    ),
    Contradiction(
        '`terminate_on_cancel` without `on_duplicate="cancel"`',
        lambda g: g.raw.get("terminate_on_cancel") is True and g.on_duplicate != "cancel",
        lambda g: (
            "terminate_on_cancel without on_duplicate='cancel': nothing cancels a run; write "
            "on_duplicate='cancel' with it, or drop it"
        ),
    ),
    Contradiction(
        (
            '`on_duplicate="cancel"` with `throttle`, `reopen_on`, `dedupe=False` or a lock '
            "scope other than `until_executing`"
        ),
        lambda g: g.on_duplicate == "cancel" and bool(_cancel_clashes(g.raw)),
        lambda g: (
            f"on_duplicate='cancel' with {', '.join(_cancel_clashes(g.raw))}: cancel keeps "
            "one run and one pending call per key (the pending call cancels the run); drop "
            f"{', '.join(_cancel_clashes(g.raw))}"
        ),
    ),
    Contradiction(
        '`on_duplicate="replace"` with `lock="while_executing"` or `throttle`',
        lambda g: (
            g.on_duplicate == "replace" and (g.lock == "while_executing" or g.throttle is not None)
        ),
        lambda g: (
            f"on_duplicate='replace' with {_queues_all_or_none(g)}: replace swaps the "
            "arguments of a queued call, and this mode queues every call (or none); use "
            "lock='until_executing' or the default lock scope with replace"
        ),
    ),
    Contradiction(
        "`total_limit` without `limit`",
        lambda g: g.total_limit is not None and g.limit is None,
        lambda g: (
            f"total_limit={g.total_limit} without limit: it caps the runs of every key "
            "together, next to limit=N for each key; write limit=... with it (limit=1 for "
            "one run per key)"
        ),
    ),
    Contradiction(
        "`total_order` or `weight` without `total_limit`",
        lambda g: (
            g.total_limit is None
            and any(g.values.get(option) is not None for option in ("total_order", "weight"))
        ),
        lambda g: (
            "total_order= and weight= say how a total_limit's slots go to the keys waiting "
            "for them (round robin, and each key's share): write total_limit=... with them, "
            "or drop them"
        ),
    ),
    Contradiction(
        (
            "`reopen_on` with any mode but `throttle` and the default scope (the others free "
            "the key as a run starts or ends already)"
        ),
        _reopen_changes_nothing,
        lambda g: (
            f"reopen_on={g.raw.get('reopen_on')!r} applies to throttle=... and to the default "
            "lock='until_executed' (which holds the key through a failed run's retry); the "
            "other modes free the key as a run starts or ends already: drop reopen_on"
        ),
    ),
    Contradiction(
        (
            "`max_pending` with a lock scope that keeps one call of a key waiting already (it "
            'goes with `rate`, `limit` or `lock="while_executing"`)'
        ),
        lambda g: g.max_pending is not None and g.lock != "while_executing",
        lambda g: (
            f"max_pending={g.max_pending} with lock={g.lock!r}: it caps the calls queued "
            "behind a rate, a limit or lock='while_executing'; this lock keeps at most one "
            "call of a key waiting already (add rate=... or limit=..., or drop max_pending)"
        ),
    ),
    Contradiction(
        (
            '`idempotency` with `debounce`, `on_duplicate="replace"` or `"cancel"`, or '
            "`limit` above 1"
        ),
        lambda g: g.idempotency is not None,
        lambda g: f"idempotency {g.idempotency}",
    ),
)
