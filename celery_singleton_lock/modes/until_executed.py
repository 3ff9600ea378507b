"""``lock="until_executed"`` (the default): one call per key, queued or running.

- publish: a queued hold on the key itself (``q|...``), ``queue_ttl`` long plus any
  countdown; a duplicate is refused while it is held.
- receipt: the worker makes the hold its reservation (``r|...``), renewed, ``ttl`` long.
- start: the child takes the running lease over from that reservation in one step
  (fenced, renewed); a message without a hold of its own contends.
- end: the running lease is released, so the next call is accepted only then.
"""

from __future__ import annotations

from .base import Mode


class UntilExecuted(Mode):
    name = "until_executed"
