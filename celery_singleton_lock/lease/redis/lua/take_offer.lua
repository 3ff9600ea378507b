-- Take the value offered to a holder (offer.lua), once: the holder has let go of its
-- lock first, so no offer can come after this read and be lost.
-- KEYS[1] the lock's offer key
-- ARGV[1] the holder's token
-- returns the value, or false when none was offered to this holder (an offer to an
-- earlier holder of the lock is left to expire)
local kept = redis.call('GET', KEYS[1])
if not kept then return false end
local cut = string.find(kept, '\n', 1, true)
if cut == nil or string.sub(kept, 1, cut - 1) ~= ARGV[1] then return false end
redis.call('DEL', KEYS[1])
return string.sub(kept, cut + 1)
