-- Take the value offered to a holder (offer.lua), once: the holder has let go of its
-- lock first, so no offer can come after this read and be lost.
-- KEYS[1] the lock's offers
-- ARGV[1] the holder's token
-- returns the value, or false when none was offered to this holder
local kept = redis.call('HGET', KEYS[1], ARGV[1])
if not kept then return false end
redis.call('HDEL', KEYS[1], ARGV[1])
return kept
