-- Offer a value to a lock's holder, only while that holder has it: a later call's
-- arguments left for the execution that holds a pending call's hold and waits for the
-- key, which takes them as it is let in (take_offer.lua). Once that holder has let go
-- nothing is kept: the caller then meets whoever holds the lock now.
-- The offers live as long again as the lock (extend.lua renews them with it): its holder
-- takes them just after letting go, or after a renewal that came late; one that dies
-- without taking them leaves nothing a ttl after its lock expired.
-- KEYS[1] lock key     KEYS[2] its offers (a hash: holder's token -> value)
-- ARGV[1] expected holder   ARGV[2] the value
-- returns {1}           kept for that holder (a newer offer to it replaces an older;
--                       one to a later holder of the lock never touches it)
--         {0, holder}   held by another ('' when free)
local current = redis.pcall('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  local left = redis.call('PTTL', KEYS[1])
  if left < 0 then left = 86400000 end  -- a lock with no ttl (never one of ours): a day
  redis.call('PEXPIRE', KEYS[2], 2 * left)
  return {1}
end
if type(current) ~= 'string' then current = '' end
return {0, current}
