"""Every Lua script a lock runs, one named constant each (a broker's notes: ``transit``).

All keys a script touches belong to one lock and share its hash tag (see ``lock.LockKeys``):
one Redis Cluster slot, never CROSSSLOT; the push scripts also touch a broker's lists.
Scripts are registered per client by ``lock.RedisLock`` (EVALSHA, reloaded after a
server restart by redis-py's ``Script``), never held in module state.

Needs Redis >= 5: scripts call ``TIME`` before writing, which is only replicated
safely with effects replication, the default since Redis 5.
"""

from __future__ import annotations

from .transit import NOTE, NOTE_KEYS

# Wake one waiter, only if a blocking waiter announced itself: the common path (nobody
# blocks) then writes no signal keys at all. The signal is a one-element list that a
# blocked BLPOP pops, FIFO among waiters; it expires so a wake-up nobody consumed does
# not linger. Shared by the release script below; it is not a script by itself.
_WAKE = """
local function wake(signal_key, waiters_key, signal_ttl)
  if redis.call('EXISTS', waiters_key) == 0 then return end
  redis.call('DEL', signal_key)
  redis.call('RPUSH', signal_key, '1')
  redis.call('PEXPIRE', signal_key, signal_ttl)
end
"""

# Whether a token has a given shape: starts with `prefix` and ends with `suffix`.
# Shared by the scripts below; not a script by itself.
_MATCHES = """
local function matches(value, prefix, suffix)
  return type(value) == 'string' and #value >= #prefix + #suffix
    and string.sub(value, 1, #prefix) == prefix
    and string.sub(value, #value - #suffix + 1) == suffix
end
"""

# KEYS[1] lock key     KEYS[2] fence key     KEYS[3] signal key    KEYS[4] waiters key
# ARGV[1] owner token  ARGV[2] ttl in milliseconds (positive integer)
# ARGV[3] '1' if the caller will block on the signal when this fails, else '0'
# ARGV[4] a token this caller may take over ('' for none): a queued task's hold
#         becomes its running lease in the same step, with no window in between
# ARGV[5] ARGV[6] or: a token shape (prefix, suffix) it may take over ('' prefix for
#         none), for a hold whose random part the caller cannot know
# ARGV[7] '1' for a hold that needs no fence (a queued message's: it only keeps
#         duplicates out; the execution that takes it over is fenced), else '0'
# KEYS[5] ARGV[8] optional: refuse at once if the token ARGV[8] is in the set KEYS[5]
#         (the lock's tokens SWAP replaced): a replaced message never runs, even once
#         its replacement has run and the lock is free again
# returns {-1}                  ARGV[8] was replaced
#         {1, fence}            acquired; fence strictly greater than any earlier fence
#                               of this lock (see lock.RedisLock for the bound); 0 when
#                               no fence was asked for
#         {0, holder, pttl}     held by `holder` ('' when the value is foreign or not a
#                               string) for `pttl` more ms (-1: the key has no TTL)
# The caller's own token counts as free: a retry of a call whose reply was lost in
# transit gets the same answer as the call itself.
# The fence is max(server TIME in microseconds, last fence + 1); the last fence is kept
# in one key per lock that expires with the lease (refreshed by each extend), so fencing
# state is bounded by the locks held within the last ttl, never one key per name for
# ever. Assumptions: the server's clock does not step back by more than the time
# between two acquisitions of one name, at most one acquisition of a name per
# microsecond, and fences below 2**53 (Lua numbers are doubles; TIME in microseconds
# gets there in the year 2255). A restart with persistence off loses the state but not
# monotonicity: the fence restarts from the clock.
ACQUIRE = (
    _MATCHES
    + """
if ARGV[8] and ARGV[8] ~= '' and redis.call('SISMEMBER', KEYS[5], ARGV[8]) == 1 then
  return {-1}
end
local taken = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
if not taken then
  local current = redis.pcall('GET', KEYS[1])
  if current == ARGV[1] or (ARGV[4] ~= '' and current == ARGV[4])
      or (ARGV[5] ~= '' and matches(current, ARGV[5], ARGV[6])) then
    taken = redis.call('SET', KEYS[1], ARGV[1], 'XX', 'PX', ARGV[2])
  end
  if not taken then
    if type(current) ~= 'string' then current = '' end
    local pttl = redis.call('PTTL', KEYS[1])
    if ARGV[3] == '1' then
      -- Announce a waiter for at least as long as its BLPOP can last (the holder's
      -- TTL), so every release until then pushes a wake-up. Only ever lengthened here:
      -- other waiters may be relying on the current expiry.
      local keep = (pttl > 0 and pttl or 1000) + 1000
      if redis.call('PTTL', KEYS[4]) < keep then
        redis.call('SET', KEYS[4], '1', 'PX', keep)
      end
    end
    return {0, current, pttl}
  end
end
if ARGV[7] == '1' then return {1, 0} end
local now = redis.call('TIME')
local fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
local last = tonumber(redis.pcall('GET', KEYS[2]))
if last ~= nil and last >= fence then fence = last + 1 end
-- '%.0f': Lua's default number format keeps 14 digits and would round the fence.
redis.call('SET', KEYS[2], string.format('%.0f', fence), 'PX', ARGV[2])
-- A wake-up left over from an earlier release means nothing now that the lock is held.
redis.call('DEL', KEYS[3])
return {1, fence}
"""
)

# Push to KEYS[list] (in `list_db`, '' for the lock's; `lock_db` after), PEXPIRE each key
# past the notes' (KEYS[list + 1 .. list + NOTE_KEYS]) by `expire_ms` ('' for none: a queue
# that expires unused); with a `spec`, note the message in transit (``transit.NOTE``)
# until its receipt clears it. Shared by the push scripts; not one itself.
_PUSH = (
    NOTE
    + f"""
local function push(list, payload, list_db, expire_ms, lock_db, spec)
  if list_db ~= '' then redis.call('SELECT', list_db) end
  redis.call('LPUSH', KEYS[list], payload)
  if expire_ms ~= '' then
    for i = list + {NOTE_KEYS + 1}, #KEYS do redis.call('PEXPIRE', KEYS[i], expire_ms) end
  end
  if spec ~= '' then note(list + 1, spec, KEYS[list], payload) end
  if list_db ~= '' then redis.call('SELECT', lock_db) end
end
"""
)

# A hold taken in the same step as the push of the message it holds for (a broker's
# queue on the same server): there is never a hold without its message, nor the
# message without its hold.
# KEYS[1] hold (lock) key  KEYS[2] the list to push to  KEYS[3..7] the notes' keys
# KEYS[8..] lists to expire too  ARGV[1] owner token  ARGV[2] ttl in ms  ARGV[3] payload
# ARGV[4] the list's database ('' for the lock's own)  ARGV[5] expiry ms ('' for none)
# ARGV[6] the lock's database  ARGV[7] the note's spec ('' for none)
# returns {1, 0}               held and pushed; or held by this very token already (a
#                              retry whose reply was lost: pushed then, not again)
#         {0, holder, pttl}    held by `holder` ('' when foreign); nothing pushed
# The push goes first: no rollback, so a push the server refuses (an ACL user without the
# queue's keys) finds nothing written. SELECT in a script switches only its database.
HOLD_AND_PUSH = (
    _PUSH
    + """
local current = redis.pcall('GET', KEYS[1])
if current then
  if current == ARGV[1] then return {1, 0} end
  if type(current) ~= 'string' then current = '' end
  return {0, current, redis.call('PTTL', KEYS[1])}
end
push(2, ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, 0}
"""
)


# ACQUIRE, run on another client's connection to the lock store's server (the broker's,
# in the pipeline that records a received message as unacked): it switches to the
# lock's database and back. The arguments are ACQUIRE's with ARGV[8] always given ('' for
# none), then ARGV[9] the lock's database ('' when it is the caller's) and ARGV[10] the
# caller's database. SELECT inside a script switches only the script's database.
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


RIDING_ACQUIRE = in_lock_db(ACQUIRE, 9)

# A counting lease: the first free slot of several (names.slot), in one step.
# KEYS[1] fence key    KEYS[2] waiters key   KEYS[3..] the slots' lock keys, in order
# ARGV[1] owner token  ARGV[2] ttl in milliseconds
# ARGV[3] '1' if the caller will block on the signal when this fails, else '0'
# returns {1, fence, slot number}   the lowest free slot (or the caller's own again,
#                                   so a retry after a lost reply is safe)
#         {0, holder, pttl}          every slot held; the holder and ttl of the slot
#                                   that frees soonest (-1: a slot has no TTL)
# Unlike ACQUIRE it leaves a pending wake-up in place: another slot may be free for it.
ACQUIRE_SLOT = """
local free, soonest, holder = nil, nil, ''
for i = 3, #KEYS do
  local current = redis.pcall('GET', KEYS[i])
  if current == ARGV[1] then
    free = i
    break
  elseif current == false then
    if free == nil then free = i end
  else
    local pttl = redis.call('PTTL', KEYS[i])
    if soonest == nil or (pttl >= 0 and (soonest < 0 or pttl < soonest)) then
      soonest = pttl
      holder = type(current) == 'string' and current or ''
    end
  end
end
if free ~= nil then
  redis.call('SET', KEYS[free], ARGV[1], 'PX', ARGV[2])
  local now = redis.call('TIME')
  local fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local last = tonumber(redis.pcall('GET', KEYS[1]))
  if last ~= nil and last >= fence then fence = last + 1 end
  local keep = math.max(tonumber(ARGV[2]), redis.call('PTTL', KEYS[1]))
  redis.call('SET', KEYS[1], string.format('%.0f', fence), 'PX', keep)
  return {1, fence, free - 2}
end
if ARGV[3] == '1' then
  local keep = (soonest ~= nil and soonest > 0 and soonest or 1000) + 1000
  if redis.call('PTTL', KEYS[2]) < keep then
    redis.call('SET', KEYS[2], '1', 'PX', keep)
  end
end
return {0, holder, soonest or -1}
"""

# Pass the lock KEYS[1] to `token` for `ttl` ms, recording `record` in its replaced set
# KEYS[2] for at least as long. Shared by the swap scripts below; not a script itself.
_HAND_ON = """
local function pass_to(token, ttl, record)
  redis.call('SET', KEYS[1], token, 'PX', ttl)
  redis.call('SADD', KEYS[2], record)
  if redis.call('PTTL', KEYS[2]) < tonumber(ttl) then
    redis.call('PEXPIRE', KEYS[2], ttl)
  end
end
"""

# Hand a lock from one holder to another, only if that holder has it now (never when
# it is free): a queued message's hold passed to the message that replaces it.
# KEYS[1] lock key     KEYS[2] its replaced set (see ACQUIRE's ARGV[8])
# ARGV[1] expected holder   ARGV[2] new token   ARGV[3] ttl in ms
# ARGV[4] what to record as replaced (the expected holder, or a name for it)
# returns {1, 0}                swapped (unfenced); ARGV[4] recorded as replaced for as
#                               long as the new holder's ttl at least
#         {0, holder, pttl}     held by another ('' when free; pttl -2 then)
SWAP = (
    _HAND_ON
    + """
local current = redis.pcall('GET', KEYS[1])
if current == ARGV[1] then
  pass_to(ARGV[2], ARGV[3], ARGV[4])
  return {1, 0}
end
if type(current) ~= 'string' then current = '' end
return {0, current, redis.call('PTTL', KEYS[1])}
"""
)

# SWAP and the push of the replacing message in one step (a broker's queue on the lock
# store's server): the message is pushed only if the hold passes to it.
# KEYS[1] lock key  KEYS[2] its replaced set  KEYS[3] the list to push to  KEYS[4..8]
# the notes'  KEYS[9..] lists to expire too  ARGV[1] expected holder  ARGV[2] new token
# ARGV[3] ttl in ms  ARGV[4] record  ARGV[5] the payload  ARGV[6] the list's database
# ('' for the lock's own)  ARGV[7] expiry ms ('' for none)  ARGV[8] the lock's database
# ARGV[9] the note's spec ('' for none). Returns as SWAP; {1, 0} too
# when the new token holds it already (a retry whose reply was lost). Push first, as above.
SWAP_AND_PUSH = (
    _PUSH
    + _HAND_ON
    + """
local current = redis.pcall('GET', KEYS[1])
if current == ARGV[2] then return {1, 0} end
if current ~= ARGV[1] then
  if type(current) ~= 'string' then current = '' end
  return {0, current, redis.call('PTTL', KEYS[1])}
end
push(3, ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9])
pass_to(ARGV[2], ARGV[3], ARGV[4])
return {1, 0}
"""
)

# KEYS[1] lock key     KEYS[2] signal key    KEYS[3] waiters key
# ARGV[1] owner token  ARGV[2] signal ttl in milliseconds
# returns 1 released   0 already expired (nobody holds it)   -1 not owner (someone else does)
RELEASE = (
    _WAKE
    + """
local current = redis.pcall('GET', KEYS[1])
if current == false then
  wake(KEYS[2], KEYS[3], ARGV[2])
  return 0
end
if current ~= ARGV[1] then return -1 end
redis.call('DEL', KEYS[1])
wake(KEYS[2], KEYS[3], ARGV[2])
return 1
"""
)

# RELEASE sent in the pipeline of another client of the same server (the result
# backend's, which stores the task's result in the same round trip).
# KEYS, ARGV[1..2] as RELEASE
# ARGV[3] the lock's database ('' when it is the pipeline's own)
# ARGV[4] the pipeline's database, selected again before returning
# returns as RELEASE
RIDING_RELEASE = in_lock_db(RELEASE, 3)

# KEYS[1] lock key     KEYS[2] signal key    KEYS[3] waiters key
# ARGV[1] token prefix ARGV[2] token suffix  ARGV[3] signal ttl in milliseconds
# ARGV[4] ARGV[5] optional: a second (prefix, suffix) that matches too
# returns 1 released   0 already expired   -1 held by a token matching neither shape
# For a process releasing on behalf of a dead one that knows the token's shape but not
# its random part (Celery's main process after a pool child was killed), or a hold
# that is one of two shapes (a queued call's, or the worker's reservation of it).
RELEASE_MATCHING = (
    _WAKE
    + _MATCHES
    + """
local current = redis.pcall('GET', KEYS[1])
if current == false then
  wake(KEYS[2], KEYS[3], ARGV[3])
  return 0
end
if not (matches(current, ARGV[1], ARGV[2])
    or (ARGV[4] ~= nil and ARGV[4] ~= '' and matches(current, ARGV[4], ARGV[5]))) then
  return -1
end
redis.call('DEL', KEYS[1])
wake(KEYS[2], KEYS[3], ARGV[3])
return 1
"""
)

# KEYS[1] lock key     KEYS[2] fence key     KEYS[3] (optional) a lock it yields to
# ARGV[1] owner token  ARGV[2] new ttl in milliseconds (replaces the remaining ttl)
# returns 1 extended   2 extended, and the lock it yields to is held (cancelled)
#         0 already expired   -1 not owner
EXTEND = """
local current = redis.pcall('GET', KEYS[1])
if current == false then return 0 end
if current ~= ARGV[1] then return -1 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
-- The fence state must outlive the lock it numbers, or the next fence could not build on it.
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
if KEYS[3] and redis.call('EXISTS', KEYS[3]) == 1 then return 2 end
return 1
"""

# A per-name rate limit by GCRA (``rates``): one number, the next call's theoretical
# arrival time, on the server's clock.
# KEYS[1] the name's rate key
# ARGV[1] the interval between calls in microseconds (period / limit)
# ARGV[2] the burst tolerance in microseconds ((burst - 1) * interval)
# ARGV[3] 'take', 'reserve', 'peek' or 'due'
# ARGV[4] ('due' only) a slot reserved earlier, in microseconds
# returns {state, slot, wait, remaining, now, free}: state 1 now, 2 a later slot
# reserved (due: not yet due), 0 refused (take) or not free now (peek); slot the slot's
# server time in microseconds; wait microseconds until it; remaining the calls that may
# start now after this one; now the server's time; free the next call's earliest slot.
# 'due' counts nothing: the slot was counted when it was reserved.
RATE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval, tolerance = tonumber(ARGV[1]), tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local function answer(state, slot, next_tat)
  -- the calls that may start now after this one, and when the next one may
  local left = 0
  if now + tolerance >= next_tat then
    left = math.floor((now + tolerance - next_tat) / interval) + 1
  end
  return {state, slot, math.max(0, slot - now), left, now, math.max(now, next_tat - tolerance)}
end
if ARGV[3] == 'due' then
  local reserved = tonumber(ARGV[4])
  return answer(reserved > now and 2 or 1, reserved, tat)
end
local slot = math.max(now, tat - tolerance)
if ARGV[3] == 'peek' or (ARGV[3] == 'take' and slot > now) then
  return answer(slot > now and 0 or 1, slot, tat)
end
local next_tat = tat + interval
redis.call('SET', KEYS[1], string.format('%.0f', next_tat), 'PX',
  math.ceil((next_tat - now) / 1000) + 1)
return answer(slot > now and 2 or 1, slot, next_tat)
"""

# Redlock's second step (``redlock``): the lease's fence written back on every master.
# KEYS[1] lock key    KEYS[2] fence key
# ARGV[1] owner token   ARGV[2] the lease's fence   ARGV[3] ttl in milliseconds
# Raises the master's last fence to the lease's (never lowers it) and keeps it at least
# as long as the lock; returns 1 if the token still holds the lock here, else 0.
RAISE_FENCE = """
local last = tonumber(redis.call('GET', KEYS[2]))
if last == nil or last < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
elseif redis.call('PTTL', KEYS[2]) < tonumber(ARGV[3]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
if redis.call('GET', KEYS[1]) == ARGV[1] then return 1 end
return 0
"""
