"""Many calls' messages published through one producer in one broker pipeline (kombu's
``Producer.batch()`` where the transport has one), each built by Celery's ``apply_async``;
the holds of messages certainly not sent given back."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from typing import TYPE_CHECKING

from .. import outages
from ..tokens import NAME_HEADER

if TYPE_CHECKING:
    from celery.result import AsyncResult

    from ..lease import Lease
    from .call import Dispatch, TaskFacts

logger = logging.getLogger(__name__)


def publish_together(
    calls: Sequence[Dispatch],
    producer: object,
    *,
    held: bool,
    leases: Sequence[Lease] = (),
) -> list[AsyncResult]:
    """Publish ``calls`` (with their holds, ``held``; else without, an outage under
    fail_open) on one producer of the app's (``producer`` when given): one pipeline
    where kombu batches publishes (its Redis transport, kombu >= 5.7), else one publish
    after the other on that producer's channel.

    A message that fails to build or publish (Celery's checks, a ``before_task_publish``
    receiver, the broker) stops the batch and is raised: the holds in ``leases`` (one per
    call, in order) of the messages not sent are given back first. In a pipeline nothing
    is sent until all are built, so none were; a pipeline that fails as it is written
    leaves delivery uncertain (kombu's ``BatchPublishError``), and its holds run out by
    ``queue_ttl``."""
    if not calls:
        return []
    facts = calls[0].facts
    results: list[AsyncResult] = []
    with facts.app.producer_or_acquire(producer) as real:
        pipelined = bool(getattr(real, "supports_batch_publish", False))
        built = False
        try:
            with ExitStack() as stack:
                if pipelined:
                    # One flush, at the end: none partway, so a message that fails to
                    # build sends none of the batch.
                    stack.enter_context(real.batch(max_size=sys.maxsize))
                for call in calls:
                    own: dict[str, object] = (
                        call.own_headers if held else {NAME_HEADER: call.lock_name}
                    )
                    results.append(call.publish(call.task_id, call.options, own, real))
                built = True
        except BaseException:
            if built:
                logger.warning(
                    "%s: a batch of %d messages may be partly published; their holds are "
                    "kept and run out by queue_ttl",
                    facts.name,
                    len(calls),
                )
            else:
                give_back(facts, list(leases) if pipelined else list(leases)[len(results) :])
            raise
    return results


def give_back(facts: TaskFacts, leases: Sequence[Lease]) -> None:
    """Holds whose messages were not sent: released, each owner-checked (one that cannot
    be released now runs out by its ``queue_ttl``)."""
    for lease in leases:
        outages.release_or_warn(facts.store.release, lease)


__all__ = ["give_back", "publish_together"]
