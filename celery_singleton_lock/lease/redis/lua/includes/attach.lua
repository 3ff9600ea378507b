-- Whether a lock's value `cur` is a holder a canvas member may attach to (a queued, reserved
-- or running call of ours, not an eager run): its task id, else nil. Shared by the attach
-- scripts; not one itself.
local function attachable(cur)
  if type(cur) ~= 'string' then return nil end
  local kind = string.sub(cur, 1, 2)
  if kind ~= 'q|' and kind ~= 'r|' and kind ~= 'x|' then return nil end
  if string.sub(cur, 1, 8) == 'x|eager|' then return nil end
  return string.match(cur, '|([^|]+)$')
end
-- Keep `record` (a call's whole message) for holder `holder` under field `id` of
-- KEYS[hash], and have a sweep look at `name` (KEYS[due]) from now on. HSETNX: a retry
-- whose reply was lost keeps the first record. Kept until a sweep answers or sends it.
local function attach(hash, due, id, holder, record, name)
  redis.call('HSETNX', KEYS[hash], id, cjson.encode({h = holder, c = '', u = 0, r = record}))
  local now = redis.call('TIME')
  redis.call('ZADD', KEYS[due], now[1] * 1000 + math.floor(now[2] / 1000), name)
end
