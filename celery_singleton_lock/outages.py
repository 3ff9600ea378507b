"""What the Celery layer does when the lock store is unreachable (singleton_lock_on_redis_error)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from .context import Request, TaskContext
from .exceptions import LockStoreUnavailableError
from .lease import Lease
from .policies import ContentionState, Requeue, requeue
from .tokens import OUTAGE_HEADER, OUTAGE_MAX_REQUEUES, header_count

logger = logging.getLogger(__name__)


def at_dispatch(context: TaskContext, lock_name: str, error: LockStoreUnavailableError) -> None:
    """fail_closed: refuse to publish, with what to set instead; fail_open: log and go on."""
    where = context.stores.describe()
    if context.stores.config.on_redis_error == "fail_closed":
        raise LockStoreUnavailableError(
            f"{context.name}: {error}; nothing was published. Set "
            "singleton_lock_on_redis_error='fail_open' to publish without the duplicate "
            "check when Redis is down",
            name=lock_name,
            key=error.key,
            url=where,
        ) from error
    logger.warning(
        "lock store at %s unreachable (%s): publishing %s for %s without the duplicate "
        "check (fail_open)",
        where,
        type(error).__name__,
        context.name,
        lock_name,
    )


@dataclass(frozen=True)
class OutageRequeue:
    """Send the message again in ``countdown`` s, marked with the outages it has met."""

    countdown: float
    outages: int


def at_execution(
    context: TaskContext, request: Request, lock_name: str, error: LockStoreUnavailableError
) -> Lease | OutageRequeue:
    """fail_open: run unlocked (logged); fail_closed: requeue with backoff, a bounded
    number of times, then fail. The caller sends the requeue: this module decides.

    ``request`` is Celery's request of the execution (its id and headers)."""
    where = context.stores.describe()
    if context.stores.config.on_redis_error == "fail_open":
        logger.warning(
            "lock store at %s unreachable (%s): running %s[%s] for %s UNLOCKED (fail_open)",
            where,
            type(error).__name__,
            context.name,
            request.id,
            lock_name,
        )
        return Lease.unlocked(
            lock_name,
            context.ttl,
            "running unlocked: the lock store was unreachable (fail_open)",
        )
    requeues = header_count(request, OUTAGE_HEADER)
    if requeues >= OUTAGE_MAX_REQUEUES:
        raise LockStoreUnavailableError(
            f"{context.name}[{request.id}] did not run: {error}, through "
            f"{requeues} requeues; it is not requeued again (fail_closed)",
            name=lock_name,
            key=error.key,
            url=where,
        ) from error
    logger.warning(
        "lock store at %s unreachable (%s): requeueing %s[%s] (fail_closed, %d of %d)",
        where,
        type(error).__name__,
        context.name,
        request.id,
        requeues + 1,
        OUTAGE_MAX_REQUEUES,
    )
    # Redis being down is not contention: backoff grows with the outage, but the
    # contention attempts (which end in fail) are not spent.
    backoff = requeue(max_tries=OUTAGE_MAX_REQUEUES)
    decision = backoff(ContentionState(task_name=context.name, name=lock_name, attempt=requeues))
    countdown = decision.countdown if isinstance(decision, Requeue) else backoff.cap
    return OutageRequeue(countdown, outages=requeues + 1)


def release_or_warn(release: Callable[[Lease], object], lease: Lease) -> None:
    """Release without masking the task's own outcome; a failed release expires by TTL."""
    try:
        release(lease)
    except LockStoreUnavailableError as error:
        logger.warning("release of %s failed (%s); it frees itself by its ttl", lease.key, error)
