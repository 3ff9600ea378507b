"""Every Lua script a lock runs, each read from its own file in ``lua/``.

All keys a script touches belong to one lock and share its hash tag (``names.LockKeys``): one
Redis Cluster slot, never CROSSSLOT. Scripts call ``TIME`` before writing, safe with effects
replication (the default since Redis 5; we need 6.2). ``source`` reads other folders' too.
"""

from __future__ import annotations

import re
from importlib.resources import files
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

_LUA = files(__package__) / "lua"
_INCLUDE = re.compile(r'^--- @include "([a-z_]+)"\s*$')


def source(name: str, folder: Traversable = _LUA) -> str:
    """The script ``lua/<name>.lua`` (or ``<name>.lua`` in ``folder``) as sent to Redis:
    its includes expanded (each helper once), its comment lines left out.

    Each file opens with its contract: what it does, the KEYS and ARGV it takes and what
    it returns (sidekiq-unique-jobs' ``lua/`` and BullMQ's ``commands/`` are the models).
    Helpers several scripts share live in an ``includes/`` folder and are pulled in by a
    line ``--- @include "name"`` (each once per script), never copied. A helper is looked
    for in ``folder``'s ``includes/`` first, then in ``lua/includes/``: a script in a
    folder of its own shares this folder's helpers without this module knowing of it.
    """
    return "".join(_lines(folder, name, set()))


def _lines(folder: Traversable, name: str, included: set[str]) -> list[str]:
    lines = []
    for line in (folder / f"{name}.lua").read_text().splitlines(keepends=True):
        helper = _INCLUDE.match(line)
        if helper is not None:
            path = f"includes/{helper.group(1)}"
            if path not in included:
                included.add(path)
                home = folder if (folder / f"{path}.lua").is_file() else _LUA
                lines += _lines(home, path, included)
        elif not line.lstrip().startswith("--"):
            lines.append(line)
    return lines


# The scripts' text, comments left out (they would travel with every EVAL); the stores
# register them per client (EVALSHA, reloaded after a server restart by redis-py's
# ``Script``), never in module state.
ACQUIRE = source("acquire")
ACQUIRE_SLOT = source("acquire_slot")
SWAP = source("swap")
RELEASE = source("release")
RELEASE_MATCHING = source("release_matching")
EXTEND = source("extend")
RATE = source("rate")
KEEP_RATE = source("keep_rate")
BACKLOG_ENTER = source("backlog_enter")
OFFER = source("offer")
TAKE_OFFER = source("take_offer")
RAISE_FENCE = source("raise_fence")
IDEMPOTENCY_CLAIM = source("idempotency_claim")
IDEMPOTENCY_BEGIN = source("idempotency_begin")
IDEMPOTENCY_END = source("idempotency_end")
HOLD_MANY = source("hold_many")
HOLD_OR_ATTACH = source("hold_or_attach")
CLAIM_ATTACHED = source("claim_attached")
FINISH_ATTACHED = source("finish_attached")
PROMOTE_ATTACHED = source("promote_attached")
TURN_TAKE = source("turn_take")
TURN_HAND_OUT = source("turn_hand_out")
TURN_GIVE_BACK = source("turn_give_back")


def in_lock_db(script: str, db: int) -> str:
    """``script`` run on another client's connection to the lock store's server:
    ARGV[db] is the lock's database ('' when it is the caller's), ARGV[db + 1] the
    caller's, selected again before returning."""
    return f"""local function run()
{script}end
if ARGV[{db}] ~= '' then redis.call('SELECT', ARGV[{db}]) end
local reply = run()
if ARGV[{db}] ~= '' then redis.call('SELECT', ARGV[{db + 1}]) end
return reply
"""


# ACQUIRE run on another client's connection to the lock store's server (in a pipeline
# that client sends anyway, such as a message broker's): it switches to the
# lock's database and back. The arguments are ACQUIRE's with ARGV[8] always given ('' for
# none), then ARGV[9] the lock's database ('' when it is the caller's) and ARGV[10] the
# caller's database. SELECT inside a script switches only the script's database.
RIDING_ACQUIRE = in_lock_db(ACQUIRE, 9)

# RELEASE sent in the pipeline of another client of the same server (the result
# backend's, which stores the task's result in the same round trip): ARGV[3] the lock's
# database ('' when it is the pipeline's own), ARGV[4] the pipeline's, selected again
# before returning. Returns as RELEASE.
RIDING_RELEASE = in_lock_db(RELEASE, 3)
