-- Note a message `payload` just pushed to `list` (a key), for the `spec` {member, hold's
-- name, its token, ms its hold lasts, ms to wait}: the notes' keys are KEYS[k .. k + 4].
-- Each noted push to a list is numbered: a message received whose number is greater
-- than a noted one's means that one was popped before (a list is popped in order).
-- Shared by the push scripts (includes/push.lua, push_noted.lua); not a script itself.
-- The notes' keys, in this order wherever a script takes them: the due set (member ->
-- when to look next), the records (member -> {name, token, list, pushed at ms, missing
-- since ms or 0, ends at ms, seq, 1 once pushed again}), the payloads (member -> the
-- message as pushed), each list's last push number (list -> seq) and the greatest
-- number received (list -> seq). transit.NOTE_KEYS says the same to Python.
local NOTE_KEYS = 5
local function note(k, spec, list, payload)
  local n = cjson.decode(spec)
  local now = redis.call('TIME')
  local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  local seq = redis.call('HINCRBY', KEYS[k + 3], list, 1)
  redis.call('HSET', KEYS[k + 1], n[1], cjson.encode({n[2], n[3], list, ms, 0, ms + n[4], seq}))
  redis.call('HSET', KEYS[k + 2], n[1], payload)
  redis.call('ZADD', KEYS[k], ms + n[5], n[1])
end
