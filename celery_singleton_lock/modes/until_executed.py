"""``lock="until_executed"`` (the default): one call per key, queued or running.

The stages (publish, receipt, start, end) are in ``UntilExecuted``'s docstring.
"""

from __future__ import annotations

from .base import Mode
from .choosing import Choice


class UntilExecuted(Mode):
    """One call per key from its publish to the end of its run: ``Mode`` as it is.

    - publish: a queued hold on the key itself (``q|...``), ``queue_ttl`` long plus any
      countdown; a duplicate is refused while it is held.
    - receipt: the worker makes the hold its reservation (``r|...``), renewed, ``ttl`` long.
    - start: the child takes the running lease over from that reservation in one step
      (fenced, renewed); a message without a hold of its own contends.
    - end: the running lease is released, so the next call is accepted only then.
    """

    name = "until_executed"


CHOICE = Choice(
    UntilExecuted.name,
    {"lock": "until_executed"},
    lambda chosen: UntilExecuted(chosen.as_duplicate),
)
