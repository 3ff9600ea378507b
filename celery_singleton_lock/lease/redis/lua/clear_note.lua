-- A received message's note cleared, in the pipeline that records it as unacked.
--
-- KEYS[1..5] the notes'  ARGV[1] its member. Its number counts as received for its list.
-- returns 1 cleared   0 not noted (cleared before, or never noted)
--- @include "forget"
local raw = redis.call('HGET', KEYS[2], ARGV[1])
if not raw then return 0 end
local r = cjson.decode(raw)
if r[7] > tonumber(redis.call('HGET', KEYS[5], r[3]) or 0) then
  redis.call('HSET', KEYS[5], r[3], r[7])
end
forget(ARGV[1])
return 1
