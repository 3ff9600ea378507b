"""``SingletonTask``: the Celery lifecycle of a singleton task, at dispatch and at execution.

Dispatch (``apply_async``, and so ``delay``, signatures and canvas): derive the key,
take a *queued hold* on it in one round trip and publish with the key and the hold's
token in the message headers; a duplicate gets ``on_duplicate``. Execution (the worker,
or eagerly): take the *running lease* for the key the sender computed, taking over the
message's own hold in the same step, renew it while the body runs, expose it as
``self.lease``, and release it however the body ends. A message that arrives without a
hold of its own (``send_task``, beat, a redelivery) meets ``on_contention``.

Tokens say who holds a key, so that another process can act for the holder:
``q|<nonce>|<task id>`` for a queued hold, ``r|<host>|<nonce>|<task id>`` once a
worker has received the message (its main process renews that reservation, so a
worker that dies with prefetched messages frees their keys within ``ttl``, see
``worker.py``), ``x|<host>|<pid>|<nonce>|<task id>`` for a running lease. The worker's
main process releases a dead child's lease by that shape (see
``worker.SingletonRequest``); a redelivered copy of the same task id is a different
execution with a different token, so it can never pass for the owner.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, ClassVar, TypeAlias

from celery import Task
from celery.exceptions import Ignore
from celery.signals import before_task_publish
from celery.utils import uuid

from . import signals as singleton_signals
from ._time import ttl_to_ms
from .backend import Backend
from .exceptions import (
    ConfigurationError,
    DuplicateTaskError,
    LockNotAcquiredError,
    LockStoreUnavailableError,
)
from .keys import KeySpec
from .lease import Contended, Lease, PendingAcquire
from .policies import (
    ContentionPolicy,
    ContentionState,
    Fail,
    OnDuplicate,
    Requeue,
    Wait,
    contention_policy,
    on_duplicate_option,
    requeue,
)

logger = logging.getLogger(__name__)

KEY_HEADER = "singleton_lock_key"
TOKEN_HEADER = "singleton_lock_token"  # noqa: S105  (a header name, not a secret)
ATTEMPT_HEADER = "singleton_lock_attempt"
OUTAGE_HEADER = "singleton_lock_outages"  # requeues so far because the store was unreachable
# An execution requeued this many times for an unreachable store (about an hour with the
# backoff below) fails with LockStoreUnavailableError instead of waiting for ever.
OUTAGE_MAX_REQUEUES = 120
# An apply_async option (popped before publishing) that skips the queue-level hold:
# used to requeue a contended execution, which must not meet its own duplicate check.
BYPASS_OPTION = "singleton_lock_bypass"

_Publish: TypeAlias = Callable[..., Any]

OPTION_NAMES = ("key", "on_duplicate", "on_contention", "ttl", "queue_ttl", "dedupe")


# -- tokens ---------------------------------------------------------------------------


def _nonce() -> str:
    # Tells apart two holds of one task id (a task_id= reused by the caller); it needs
    # to be unique, not secret. random reseeds in a forked child, and unlike secrets
    # it costs no system call on the dispatch path.
    return f"{random.getrandbits(48):012x}"


def queued_token(task_id: str) -> str:
    return f"q|{_nonce()}|{task_id}"


def reserved_shape(hostname: str, task_id: str) -> tuple[str, str]:
    """(prefix, suffix) of a worker's reservation of a message it received."""
    return f"r|{hostname}|", f"|{task_id}"


def reserved_token(task_id: str, hostname: str) -> str:
    prefix, suffix = reserved_shape(hostname, task_id)
    return f"{prefix}{_nonce()}{suffix}"


def running_prefix(hostname: str, pid: int) -> str:
    return f"x|{hostname}|{pid}|"


def running_token(task_id: str, hostname: str, pid: int) -> str:
    return f"{running_prefix(hostname, pid)}{_nonce()}|{task_id}"


def holder_task_id(token: str | None) -> str | None:
    """The task id inside a holder's token; None for a foreign value."""
    if not token:
        return None
    if token.startswith("q|"):
        parts = token.split("|", 2)
        return parts[2] if len(parts) == 3 else None
    if token.startswith("r|"):
        parts = token.split("|", 3)
        return parts[3] if len(parts) == 4 else None
    if token.startswith("x|"):
        parts = token.split("|", 4)
        return parts[4] if len(parts) == 5 else None
    return None


def header(request: Any, name: str) -> Any:
    """A custom header of the running request, in the worker and eagerly alike."""
    headers = getattr(request, "headers", None) or {}
    value = headers.get(name)
    return getattr(request, name, None) if value is None else value


# -- options ----------------------------------------------------------------------------


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


def _delay_of(options: Mapping[str, Any]) -> float:
    """Seconds until an ETA/countdown task may run, so its hold outlives the wait."""
    countdown = options.get("countdown")
    if countdown:
        return max(0.0, float(countdown))
    eta = options.get("eta")
    if eta is None:
        return 0.0
    if isinstance(eta, str):
        eta = datetime.fromisoformat(eta)
    now = datetime.now(eta.tzinfo or timezone.utc) if eta.tzinfo else datetime.now()
    return max(0.0, (eta - now).total_seconds())


def _in_canvas(link: object, link_error: object, options: Mapping[str, Any]) -> bool:
    # Refusing a message that carries the rest of a chain, a group slot or a chord
    # header would silently drop that work (or leave a GroupResult waiting forever).
    # Such messages skip the queue-level hold; the execution level still keeps them
    # from running concurrently with a duplicate.
    return bool(
        link
        or link_error
        or options.get("chain") is not None
        or options.get("group_id")
        or options.get("chord")
    )


class SingletonTask(Task):  # type: ignore[misc]
    """A Celery task that never runs concurrently with its duplicate, nor queues one.

    Options go in the ``singleton`` task option (``@app.task(base=SingletonTask,
    singleton={"key": ["order_id"]})``) or as keywords of ``@singleton_task``.
    """

    singleton: ClassVar[Mapping[str, Any] | None] = None
    Request = "celery_singleton_lock.worker:SingletonRequest"
    _singleton_options: ClassVar[SingletonOptions | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._singleton_options = None
        # Validate when the task class is created (i.e. when the decorator runs), not at
        # the first call; class-based tasks without a name yet are checked on first use.
        if "run" in cls.__dict__ and cls.name:
            cls.singleton_options()

    @classmethod
    def singleton_options(cls) -> SingletonOptions:
        options = cls.__dict__.get("_singleton_options")
        if options is None:
            options = SingletonOptions.build(
                cls.name, cls.__dict__.get("run", cls.run), cls.singleton
            )
            cls._singleton_options = options
        return options

    # -- what the body sees -------------------------------------------------------------

    @property
    def lease(self) -> Lease:
        """The running lease of this execution: ``fence``, ``check()``."""
        lease: Lease | None = getattr(self.request, "singleton_lease", None)
        if lease is None:
            raise RuntimeError(
                f"{self.name}: self.lease exists only while the task runs in a worker or "
                "eagerly (apply(), task_always_eager), not when it is called as a function"
            )
        return lease

    @property
    def _singleton_store(self) -> Backend:
        return Backend.for_app(self.app)

    def _ttl(self) -> float:
        return self.singleton_options().ttl or self._singleton_store.config.ttl

    def _queue_ttl(self) -> float:
        return self.singleton_options().queue_ttl or self._singleton_store.config.queue_ttl

    # -- dispatch -------------------------------------------------------------------------

    def apply_async(  # noqa: PLR0917  (Celery's own signature)
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: Any = None,
        **options: Any,
    ) -> Any:
        # dedupe=False per call: publish without the queue-level check (the execution
        # level still excludes duplicates). For sweeps that re-drive work they believe
        # lost: the hold may belong to a message stuck in a dead worker's prefetch.
        bypass = options.pop(BYPASS_OPTION, False) or options.pop("dedupe", True) is False
        producer = producer or options.pop("publisher", None)  # Celery's old alias
        publish = self._publisher(
            args, kwargs, producer=producer, link=link, link_error=link_error, shadow=shadow
        )
        if task_id is not None:
            request = self.request
            running: Lease | None = getattr(request, "singleton_lease", None)
            if running is not None and task_id == request.id:
                # Celery's retry re-sends the running task under the same id: the key
                # passes from this execution to the retry's message, with no gap.
                return self._send_retry(running, task_id, options, publish=publish)
        opts = self.singleton_options()
        key = opts.key.derive(args or (), kwargs or {})  # KeyDerivationError: nothing sent
        if bypass or not opts.dedupe or _in_canvas(link, link_error, options):
            return publish(task_id, options, {KEY_HEADER: key})
        task_id = task_id or uuid()
        token = queued_token(task_id)
        ttl = self._queue_ttl() + _delay_of(options)
        try:
            pending = self._singleton_store.lock.begin_try_acquire(
                key, ttl, token=token, fenced=False
            )
        except LockStoreUnavailableError as error:
            self._redis_error_at_dispatch(key, error)
            return publish(task_id, options, {KEY_HEADER: key})
        gate = _Gate(self, key, pending)
        ours = {KEY_HEADER: key, TOKEN_HEADER: token}
        try:
            if self._can_overlap(options) and not _refusals.expects(key):
                # The acquire is on its way; Celery builds the message meanwhile and the
                # gated producer waits for the answer just before anything is published.
                with self.app.producer_or_acquire(producer) as real:
                    result = publish(task_id, options, ours, via=_GatedProducer(real, gate))
            else:
                gate.check()
                result = publish(task_id, options, ours)
        except _Refused as refused:
            _refusals.note(key, refused.held.retry_after)
            return self._duplicate(key, refused.held)
        except BaseException:
            # Whatever stopped the message (Celery's own validation, the broker), the
            # caller may try again: a hold granted to a message never sent is given back.
            gate.give_back()
            raise
        if not gate.checked:  # Celery returned without publishing through the gate
            gate.give_back()
        _refusals.forget(key)
        return result

    def _can_overlap(self, options: Mapping[str, Any]) -> bool:
        # Only while nothing can observe the message before our gate: an eager call
        # runs the task instead of publishing, connection= makes Celery use its own
        # producer, and a before_task_publish receiver (tracing, audit) would be told of
        # a duplicate that is then never published.
        return not (
            self.app.conf.task_always_eager
            or options.get("connection") is not None
            or before_task_publish.receivers
        )

    def _publisher(
        self, args: Any, kwargs: Any, *, producer: Any, link: Any, link_error: Any, shadow: Any
    ) -> _Publish:
        def publish(
            task_id: str | None, options: dict[str, Any], ours: dict[str, Any], via: Any = None
        ) -> Any:
            headers = {**(options.pop("headers", None) or {}), **ours}
            if TOKEN_HEADER not in ours:
                headers.pop(TOKEN_HEADER, None)  # a copied request must not claim a stale hold
            return super(SingletonTask, self).apply_async(
                args,
                kwargs,
                task_id=task_id,
                producer=via or producer,
                link=link,
                link_error=link_error,
                shadow=shadow,
                headers=headers,
                **options,
            )

        return publish

    def _duplicate(self, key: str, held: Contended) -> Any:
        holder = holder_task_id(held.holder)
        singleton_signals.duplicate_refused.send(sender=self, key=key, holder_id=holder)
        if self.singleton_options().on_duplicate == "return" and holder is not None:
            logger.info("duplicate of %s refused for %s: returning %s", self.name, key, holder)
            return self.AsyncResult(holder)
        raise DuplicateTaskError(
            f"{self.name} is already queued or running for {key!r}"
            + (f" as task {holder}" if holder else " (holder unknown)"),
            name=key,
            key=held.key,
            task_id=holder,
        )

    def _redis_error_at_dispatch(self, key: str, error: LockStoreUnavailableError) -> None:
        where = self._singleton_store.describe()
        if self._singleton_store.config.on_redis_error == "fail_closed":
            raise LockStoreUnavailableError(
                f"{self.name}: {error}; nothing was published. Set "
                "singleton_lock_on_redis_error='fail_open' to publish without the duplicate "
                "check when Redis is down",
                name=key,
                key=error.key,
                url=where,
            ) from error
        logger.warning(
            "lock store at %s unreachable (%s): publishing %s for %s without the duplicate "
            "check (fail_open)",
            where,
            type(error).__name__,
            self.name,
            key,
        )

    def _send_retry(
        self,
        running: Lease,
        task_id: str,
        options: dict[str, Any],
        *,
        publish: _Publish,
    ) -> Any:
        store = self._singleton_store.lock
        token = queued_token(task_id)
        headers: dict[str, Any] = {KEY_HEADER: running.name}
        try:
            outcome = store.hand_over(running, self._queue_ttl() + _delay_of(options), token=token)
        except LockStoreUnavailableError as error:
            # The retry is sent anyway: losing it would be worse. It meets on_contention
            # at execution if this execution's lease is still there.
            logger.warning("retry of %s could not keep %s: %s", self.name, running.name, error)
            outcome = None
        if isinstance(outcome, Lease):
            headers[TOKEN_HEADER] = token
            self.request.singleton_handed_over = True
        elif isinstance(outcome, Contended):
            logger.warning("retry of %s: the lease on %s was already lost", self.name, running.name)
        try:
            return publish(task_id, options, headers)
        except BaseException:
            if isinstance(outcome, Lease):
                _quietly(store.release, outcome)
            raise

    # -- execution -----------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly or request.id is None:
            # Called as a plain function: no message, no duplicate to exclude.
            return super().__call__(*args, **kwargs)
        # Celery's Task.__call__ would push a fresh, id-less request over the worker's;
        # the worker's tracer has pushed the real one already, so run the body directly.
        lease = self._take_lease(request, args, kwargs)
        request.singleton_lease = lease
        try:
            return self.run(*args, **kwargs)
        finally:
            request.singleton_lease = None
            if lease.token and not getattr(request, "singleton_handed_over", False):
                # In a worker the release is sent now and its answer read at the child's
                # next lock call: nothing here acts on it, and the child is free for its
                # next task a round trip sooner. An eager caller may look at the key next.
                store = self._singleton_store.lock
                _quietly(store.release if request.is_eager else store.release_nowait, lease)

    def _take_lease(self, request: Any, args: Any, kwargs: Any) -> Lease:
        key = header(request, KEY_HEADER) or self.singleton_options().key.derive(args, kwargs)
        queued = header(request, TOKEN_HEADER)
        attempt = int(header(request, ATTEMPT_HEADER) or 0)
        hostname = request.hostname
        token = running_token(request.id, hostname or "eager", os.getpid())
        # The message's own hold: as queued at dispatch, or as reserved by the worker's
        # main process when it received the message.
        own = {
            "replace": queued,
            "replace_shape": reserved_shape(hostname, request.id) if hostname else None,
        }
        store = self._singleton_store.lock
        ttl = self._ttl()
        try:
            outcome = store.try_acquire(key, ttl, token=token, **own)
        except LockStoreUnavailableError as error:
            return self._redis_error_at_execution(key, attempt, error)
        if isinstance(outcome, Contended):
            outcome = self._contend(key, outcome, attempt, token=token, own=own)
        store.renew(outcome)
        return outcome

    def _contend(
        self, key: str, held: Contended, attempt: int, *, token: str, own: dict[str, Any]
    ) -> Lease:
        policy = self.singleton_options().on_contention
        state = ContentionState(
            task_name=self.name,
            key=key,
            attempt=attempt,
            holder=holder_task_id(held.holder) or held.holder or None,
            retry_after=held.retry_after,
        )
        decision = policy(state)
        singleton_signals.execution_contended.send(
            sender=self, key=key, holder_id=state.holder, decision=decision
        )
        if isinstance(decision, Wait):
            try:
                return self._singleton_store.waiting.acquire(
                    key, self._ttl(), timeout=decision.timeout, token=token, **own
                )
            except LockNotAcquiredError as error:
                state = ContentionState(
                    task_name=self.name,
                    key=key,
                    attempt=attempt,
                    holder=holder_task_id(error.holder) or error.holder,
                    retry_after=error.retry_after,
                    waited=True,
                )
                decision = policy(state)
        if isinstance(decision, Requeue):
            self._requeue(key, attempt + 1, decision.countdown)
        if isinstance(decision, Fail):
            raise DuplicateTaskError(
                f"{self.name}[{self.request.id}] did not run: {decision.reason}",
                name=key,
                key=held.key,
                task_id=state.holder,
            )
        raise ConfigurationError(f"{self.name}: contention policy returned {decision!r}")

    def _requeue(
        self, key: str, attempt: int, countdown: float, *, outages: int | None = None
    ) -> None:
        request = self.request
        logger.info(
            "%s[%s] requeued in %.2fs for %s (attempt %d)",
            self.name,
            request.id,
            countdown,
            key,
            attempt,
        )
        headers = {**(request.headers or {}), KEY_HEADER: key, ATTEMPT_HEADER: attempt}
        headers.pop(TOKEN_HEADER, None)
        if outages is not None:
            headers[OUTAGE_HEADER] = outages
        # Same id, links, chain and options as this message (what Celery's retry re-sends),
        # without counting as a retry of the task's own max_retries.
        self.signature_from_request(request, countdown=countdown, headers=headers).apply_async(
            **{BYPASS_OPTION: True}
        )
        raise Ignore(f"requeued: {key!r} is held by another execution")

    def _redis_error_at_execution(
        self, key: str, attempt: int, error: LockStoreUnavailableError
    ) -> Lease:
        where = self._singleton_store.describe()
        if self._singleton_store.config.on_redis_error == "fail_open":
            logger.warning(
                "lock store at %s unreachable (%s): running %s[%s] for %s UNLOCKED (fail_open)",
                where,
                type(error).__name__,
                self.name,
                self.request.id,
                key,
            )
            return Lease.unlocked(
                key, self._ttl(), "running unlocked: the lock store was unreachable (fail_open)"
            )
        outages = int(header(self.request, OUTAGE_HEADER) or 0)
        if outages >= OUTAGE_MAX_REQUEUES:
            raise LockStoreUnavailableError(
                f"{self.name}[{self.request.id}] did not run: {error}, through "
                f"{outages} requeues; it is not requeued again (fail_closed)",
                name=key,
                key=error.key,
                url=where,
            ) from error
        logger.warning(
            "lock store at %s unreachable (%s): requeueing %s[%s] (fail_closed, %d of %d)",
            where,
            type(error).__name__,
            self.name,
            self.request.id,
            outages + 1,
            OUTAGE_MAX_REQUEUES,
        )
        # Redis being down is not contention: backoff grows with the outage, but the
        # contention attempts (which end in fail) are not spent.
        backoff = requeue(max_tries=OUTAGE_MAX_REQUEUES)
        decision = backoff(ContentionState(task_name=self.name, key=key, attempt=outages))
        countdown = decision.countdown if isinstance(decision, Requeue) else backoff.cap
        self._requeue(key, attempt, countdown, outages=outages + 1)
        raise AssertionError("unreachable")  # pragma: no cover - _requeue raises


class _RecentRefusals:
    """Keys this process was refused recently, until their holder's lease runs out.

    Only picks the order of a dispatch, never its outcome (Redis decides every time):
    a key just refused is likely refused again (a storm of duplicates), and then asking
    first is cheaper than building a message that will not be sent.
    """

    LIMIT = 4096

    def __init__(self) -> None:
        self._until: dict[str, float] = {}

    def expects(self, key: str) -> bool:
        until = self._until.get(key)
        return until is not None and until > time.monotonic()

    def note(self, key: str, retry_after: float | None) -> None:
        if len(self._until) >= self.LIMIT:
            self._until.clear()  # cheaper than an LRU; a forgotten key costs one overlap
        self._until[key] = time.monotonic() + (1.0 if retry_after is None else retry_after)

    def forget(self, key: str) -> None:
        self._until.pop(key, None)


_refusals = _RecentRefusals()


class _Refused(BaseException):
    """Raised by the gated producer for a duplicate, caught by ``apply_async``.

    A BaseException so that nothing between the two (Celery wraps publishing in
    retry-and-log handlers for Exception) takes it for a failed publish.
    """

    def __init__(self, held: Contended) -> None:
        super().__init__(held.key)
        self.held = held


class _Gate:
    """The answer to a dispatch's acquire, checked once before its message leaves."""

    __slots__ = ("_key", "_pending", "_task", "checked")

    def __init__(self, task: SingletonTask, key: str, pending: PendingAcquire) -> None:
        self._task = task
        self._key = key
        self._pending = pending
        self.checked = False

    def check(self) -> None:
        """Return to publish; raise ``_Refused`` for a duplicate, or the store error."""
        self.checked = True
        try:
            outcome = self._pending.outcome()
        except LockStoreUnavailableError as error:
            # fail_closed raises; fail_open publishes. The message's token then claims a
            # hold that may not exist, which only means it meets on_contention if taken.
            self._task._redis_error_at_dispatch(self._key, error)
            return
        if isinstance(outcome, Contended):
            raise _Refused(outcome)

    def give_back(self) -> None:
        """The message was not published: release the hold if one was granted."""
        try:
            outcome = self._pending.outcome()
        except LockStoreUnavailableError:
            return  # nothing known to give back; a hold would expire by its queue_ttl
        if isinstance(outcome, Lease):
            _quietly(self._task._singleton_store.lock.release, outcome)


class _GatedProducer:
    """Celery's producer, made to wait for the gate before a message leaves."""

    __slots__ = ("_gate", "_producer")

    def __init__(self, producer: Any, gate: _Gate) -> None:
        self._producer = producer
        self._gate = gate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    def publish(self, *args: Any, **kwargs: Any) -> Any:
        if not self._gate.checked:  # Celery may call again to retry a failed publish
            self._gate.check()
        return self._producer.publish(*args, **kwargs)


def _quietly(release: Callable[[Lease], object], lease: Lease) -> None:
    """Release without masking the task's own outcome; a failed release expires by TTL."""
    try:
        release(lease)
    except LockStoreUnavailableError as error:
        logger.warning("release of %s failed (%s); it frees itself by its ttl", lease.key, error)


__all__ = ["SingletonOptions", "SingletonTask"]
