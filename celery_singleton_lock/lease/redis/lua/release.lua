-- Release a lock the token holds, and wake one waiter.
--
-- KEYS[1] lock key     KEYS[2] signal key    KEYS[3] waiters key
-- ARGV[1] owner token  ARGV[2] signal ttl in milliseconds
-- returns 1 released   0 already expired (nobody holds it)   -1 not owner (someone else does)
--- @include "wake"
local current = redis.pcall('GET', KEYS[1])
if current == false then
  wake(KEYS[2], KEYS[3], ARGV[2])
  return 0
end
if current ~= ARGV[1] then return -1 end
redis.call('DEL', KEYS[1])
wake(KEYS[2], KEYS[3], ARGV[2])
return 1
