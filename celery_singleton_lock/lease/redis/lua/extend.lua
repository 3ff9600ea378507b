-- Extend a lock the token holds (the renewal), and say whether a lock it yields to is held.
--
-- KEYS[1] lock key     KEYS[2] fence key     KEYS[3] offers to its holder (offer.lua)
-- KEYS[4] (optional) a lock it yields to
-- ARGV[1] owner token  ARGV[2] new ttl in milliseconds (replaces the remaining ttl)
-- returns 1 extended   2 extended, and the lock it yields to is held (cancelled)
--         0 already expired   -1 not owner
local current = redis.pcall('GET', KEYS[1])
if current == false then return 0 end
if current ~= ARGV[1] then return -1 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
-- The fence state must outlive the lock it numbers, or the next fence could not build on it.
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
-- Offers live as long again as their lock (offer.lua): taken by the holder as it lets go,
-- or gone a ttl after it (a missing key is left missing).
redis.call('PEXPIRE', KEYS[3], 2 * tonumber(ARGV[2]))
if KEYS[4] and redis.call('EXISTS', KEYS[4]) == 1 then return 2 end
return 1
