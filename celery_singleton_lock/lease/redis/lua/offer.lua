-- Offer a value to a lock's holder, only while that holder has it: a later call's
-- arguments left for the execution that holds a pending call's hold and waits for the
-- key, which takes them as it is let in (take_offer.lua). Once that holder has let go
-- nothing is kept: the caller then meets whoever holds the lock now.
-- KEYS[1] lock key     KEYS[2] its offers (a hash: holder's token -> value)
-- ARGV[1] expected holder   ARGV[2] the value   ARGV[3] ttl in ms
-- returns {1}           kept for that holder (a newer offer to it replaces an older;
--                       one to a later holder of the lock never touches it)
--         {0, holder}   held by another ('' when free)
local current = redis.pcall('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[3]) then
    redis.call('PEXPIRE', KEYS[2], ARGV[3])
  end
  return {1}
end
if type(current) ~= 'string' then current = '' end
return {0, current}
