-- A call attached to a holder that ended without an outcome becomes a call of its own:
-- it holds the key as its message's hold, claimed for the sweep to send; every other call
-- attached to that holder now waits for it. A key another call holds meanwhile: they
-- all wait for that call instead. Each is entered in the lock's history, where its call's
-- task keeps one: `promoted` (from the gone holder), `attached` (to the call it waits for).
-- KEYS[1] lock key  KEYS[2] the lock's attached calls  KEYS[3] the due index
-- KEYS[4] the lock's history
-- ARGV[1] the lock's name  ARGV[2] the gone holder's task id  ARGV[3] the task id to
-- promote  ARGV[4] claim token  ARGV[5] claim ms
-- returns {1, record}  promoted: send it with its hold
--         {2, holder}  attached, with the gone holder's other calls, to `holder` (a token)
--         {3}          held by a value no call attaches to: send it without a hold
--         {0}          nothing to do: the holder is back, or the call was claimed or sent
--- @include "attach"
local current = redis.pcall('GET', KEYS[1])
local live = attachable(current)
if live == ARGV[2] then return {0} end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local raw = redis.call('HGET', KEYS[2], ARGV[3])
if not raw then return {0} end
local rec = cjson.decode(raw)
if rec.h ~= ARGV[2] or (rec.c ~= '' and rec.u >= now) then return {0} end
if current and not live then return {3} end
local target = live
if not current or current == rec.t then
  -- Free: it holds the key. Or held by its own hold already (promoted before, and its
  -- message not sent then): sent now.
  if not current then redis.call('SET', KEYS[1], rec.t, 'PX', rec.l) end
  rec.c = ARGV[4]
  rec.u = now + tonumber(ARGV[5])
  redis.call('HSET', KEYS[2], ARGV[3], cjson.encode(rec))
  target = ARGV[3]
  current = false
  entry(4, rec.y, 'promoted', {'holder', ARGV[2]})
end
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all, 2 do
  local other = cjson.decode(all[i + 1])
  local mine = all[i] == ARGV[3] and target == ARGV[3]
  if not mine and other.h == ARGV[2] and (other.c == '' or other.u < now) then
    other.h = target
    other.c = ''
    redis.call('HSET', KEYS[2], all[i], cjson.encode(other))
    entry(4, other.y, 'attached', {'holder', target})
  end
end
redis.call('ZADD', KEYS[3], now, ARGV[1])
if current then return {2, current} end
return {1, rec.r}
