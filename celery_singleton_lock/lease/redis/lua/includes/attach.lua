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
-- KEYS[hash], with the hold its message carries (`token`, for `ttl` ms: taken if it is
-- promoted), and have a sweep look at `name` (KEYS[due]) from now on. HSETNX: a retry
-- whose reply was lost keeps the first record. Kept until a sweep answers or sends it.
-- A record: {h holder's task id, c claim ('' none), u claimed until (ms), r record,
-- t token, l ttl ms}.
local function attach(hash, due, id, holder, record, name, token, ttl)
  local kept = {h = holder, c = '', u = 0, r = record, t = token, l = tonumber(ttl)}
  redis.call('HSETNX', KEYS[hash], id, cjson.encode(kept))
  local now = redis.call('TIME')
  redis.call('ZADD', KEYS[due], now[1] * 1000 + math.floor(now[2] / 1000), name)
end
