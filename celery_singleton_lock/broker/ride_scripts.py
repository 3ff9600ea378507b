"""The broker ride's Lua, each script read from its own file in ``broker/lua/``.

These scripts know kombu's layout (its queue lists, its unacked hash) and the notes of
messages in transit; their helpers are in ``broker/lua/includes/``, and a helper the
lease's scripts share (``hand_on``) is read from ``lease/redis/lua/includes/``.
"""

from __future__ import annotations

import hashlib
from importlib.resources import files

from ..lease.redis import scripts

LUA = files(__package__) / "lua"


def source(name: str) -> str:
    """The script ``broker/lua/<name>.lua`` as sent to Redis (``lease.redis.scripts.source``)."""
    return scripts.source(name, LUA)


def digest(script: str) -> str:
    """The name Redis gives ``script`` (EVALSHA's)."""
    return hashlib.sha1(script.encode(), usedforsecurity=False).hexdigest()


# The scripts' text, comments left out; the ride registers them per client (redis-py's
# ``Script``) or sends them as EVAL, never loaded in module state.
HOLD_AND_PUSH = source("hold_and_push")
HOLD_PUSH_OR_ATTACH = source("hold_push_or_attach")
SWAP_AND_PUSH = source("swap_and_push")
PUSH_NOTED = source("push_noted")
SWEEP = source("sweep")
PUSH_AGAIN = source("push_again")
FORGET_NOTES = source("forget_notes")
CLEAR_NOTE = source("clear_note")
PURGED = source("purged")
RECORD = source("record")
STORE_RESULT = source("store_result")
# ARGV[1] the lock's database ('' when the pipeline's), ARGV[2] the pipeline's.
ANY_ATTACHED = scripts.in_lock_db(source("any_attached"), 1)
