-- Release a lock held by a token of a given shape (prefix, suffix), and wake one waiter.
--
-- KEYS[1] lock key     KEYS[2] signal key    KEYS[3] waiters key
-- ARGV[1] token prefix ARGV[2] token suffix  ARGV[3] signal ttl in milliseconds
-- ARGV[4] ARGV[5] optional: a second (prefix, suffix) that matches too
-- returns 1 released   0 already expired   -1 held by a token matching neither shape
-- For a process releasing on behalf of a dead one that knows the token's shape but not
-- its random part (Celery's main process after a pool child was killed), or a hold
-- that is one of two shapes (a queued call's, or the worker's reservation of it).
--- @include "wake"
--- @include "matches"
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
