-- Take a lock for a token: fenced (a running lease) or not (a queued hold), taking over
-- a given token or token shape in the same step.
--
-- KEYS[1] lock key     KEYS[2] fence key     KEYS[3] signal key    KEYS[4] waiters key
-- ARGV[1] owner token  ARGV[2] ttl in milliseconds (positive integer)
-- ARGV[3] '1' if the caller will block on the signal when this fails, else '0'
-- ARGV[4] a token this caller may take over ('' for none): a queued task's hold
--         becomes its running lease in the same step, with no window in between
-- ARGV[5] ARGV[6] or: a token shape (prefix, suffix) it may take over ('' prefix for
--         none), for a hold whose random part the caller cannot know
-- ARGV[7] '1' for a hold that needs no fence (a queued message's: it only keeps
--         duplicates out; the execution that takes it over is fenced), else '0'
-- KEYS[5] ARGV[8] optional: refuse at once if the token ARGV[8] is in the set KEYS[5]
--         (the lock's tokens swap.lua replaced): a replaced message never runs, even once
--         its replacement has run and the lock is free again
-- returns {-1}                  ARGV[8] was replaced
--         {1, fence}            acquired; fence strictly greater than any earlier fence
--                               of this lock (see store.RedisLock for the bound); 0 when
--                               no fence was asked for
--         {0, holder, pttl}     held by `holder` ('' when the value is foreign or not a
--                               string) for `pttl` more ms (-1: the key has no TTL)
-- The caller's own token counts as free: a retry of a call whose reply was lost in
-- transit gets the same answer as the call itself.
-- The fence is max(server TIME in microseconds, last fence + 1); the last fence is kept
-- in one key per lock that expires with the lease (refreshed by each extend), so fencing
-- state is bounded by the locks held within the last ttl, never one key per name for
-- ever. Assumptions: the server's clock does not step back by more than the time
-- between two acquisitions of one name, at most one acquisition of a name per
-- microsecond, and fences below 2**53 (Lua numbers are doubles; TIME in microseconds
-- gets there in the year 2255). A restart with persistence off loses the state but not
-- monotonicity: the fence restarts from the clock.
--- @include "matches"
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
