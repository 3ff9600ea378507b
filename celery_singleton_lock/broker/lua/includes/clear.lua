-- Clear a received message's note (the notes' keys being KEYS[1..5]): its number counts
-- as received for its list. Returns 1 cleared, 0 not noted (cleared before, or never
-- noted). Not a script itself.
--- @include "forget"
local function clear(member)
  local raw = redis.call('HGET', KEYS[2], member)
  if not raw then return 0 end
  local r = cjson.decode(raw)
  if r[7] > tonumber(redis.call('HGET', KEYS[5], r[3]) or 0) then
    redis.call('HSET', KEYS[5], r[3], r[7])
  end
  forget(member)
  return 1
end
