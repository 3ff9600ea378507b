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
-- What a canvas member holding `token` (task id `id`) does with the lock KEYS[1]:
-- 'hold' it (free), 'held' already (by this very token: a retry whose reply was lost),
-- 'send' without a hold (held by a value no call attaches to, or by itself), or 'attach'
-- to its holder; with the value holding it ('' when foreign), its pttl and the holder's
-- task id.
local function attach_step(token, id)
  local current = redis.pcall('GET', KEYS[1])
  if not current then return 'hold' end
  if current == token then return 'held' end
  if type(current) ~= 'string' then current = '' end
  local pttl = redis.call('PTTL', KEYS[1])
  local holder = attachable(current)
  if holder == nil or holder == id then return 'send', current, pttl end
  return 'attach', current, pttl, holder
end
-- An entry `event` in the lock's history KEYS[k], with `more` fields and those of a kept
-- call's `spec` ({f fields, n length, t ttl ms}, what its task records; nil: it keeps no
-- history). pcall: an entry refused must not undo the step it records.
local function entry(k, spec, event, more)
  if not spec then return end
  local add = {'XADD', KEYS[k], 'MAXLEN', '~', spec.n, '*', 'event', event}
  for _, fields in ipairs({more, spec.f}) do
    for _, value in ipairs(fields) do add[#add + 1] = value end
  end
  redis.pcall(unpack(add))
  redis.pcall('PEXPIRE', KEYS[k], spec.t)
end
-- Keep `record` (a call's whole message) for holder `holder` under field `id` of
-- KEYS[hash], with the hold its message carries (`token`, for `ttl` ms: taken if it is
-- promoted), and have a sweep look at `name` (KEYS[due]) from now on; `attached` entered in
-- the history KEYS[history] where `spec` (JSON, '' for none) says it is kept. HSETNX: a
-- retry whose reply was lost keeps the first record. Kept until a sweep answers or sends it.
-- A record: {h holder's task id, c claim ('' none), u claimed until (ms), r record,
-- t token, l ttl ms, y history spec (absent: none kept)}.
local function attach(hash, due, history, id, holder, record, name, token, ttl, spec)
  local kept = {h = holder, c = '', u = 0, r = record, t = token, l = tonumber(ttl)}
  if spec ~= '' then kept.y = cjson.decode(spec) end
  if redis.call('HSETNX', KEYS[hash], id, cjson.encode(kept)) == 1 then
    entry(history, kept.y, 'attached', {'holder', holder})
  end
  local now = redis.call('TIME')
  redis.call('ZADD', KEYS[due], now[1] * 1000 + math.floor(now[2] / 1000), name)
end
