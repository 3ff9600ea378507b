-- Offer a value to a lock's holder, only while that holder has it: a later call's
-- arguments left for the execution that holds a pending call's hold and waits for the
-- key, which takes them as it is let in (take_offer.lua). Once that holder has let go
-- nothing is kept: the caller then meets whoever holds the lock now.
-- KEYS[1] lock key     KEYS[2] its offer key
-- ARGV[1] expected holder   ARGV[2] the value   ARGV[3] ttl in ms
-- returns {1}           kept, tagged with the holder (a newer offer replaces an older)
--         {0, holder}   held by another ('' when free)
local current = redis.pcall('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[1] .. '\n' .. ARGV[2], 'PX', ARGV[3])
  return {1}
end
if type(current) ~= 'string' then current = '' end
return {0, current}
