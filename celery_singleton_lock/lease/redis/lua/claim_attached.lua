-- Claim attached calls whose holder no longer holds the lock, for the sweep to answer or
-- send: a claim lasts ARGV[3] ms (a sweeper that dies meanwhile leaves it to the next).
-- Each claimed is `sent` in the lock's history, where its call's task keeps one.
-- KEYS[1] lock key  KEYS[2] the lock's attached calls  KEYS[3] the due index
-- KEYS[4] the lock's history
-- ARGV[1] the lock's name  ARGV[2] claim token  ARGV[3] claim ms  ARGV[4] next look in ms
-- ARGV[5..] the task ids to claim
-- returns {id1, holder1, record1, id2, ...}: those claimed now
--- @include "attach"
local live = attachable(redis.pcall('GET', KEYS[1]))
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local out = {}
for i = 5, #ARGV do
  local raw = redis.call('HGET', KEYS[2], ARGV[i])
  if raw then
    local rec = cjson.decode(raw)
    if rec.h ~= live and (rec.c == '' or rec.u < now) then
      rec.c = ARGV[2]
      rec.u = now + tonumber(ARGV[3])
      redis.call('HSET', KEYS[2], ARGV[i], cjson.encode(rec))
      table.insert(out, ARGV[i])
      table.insert(out, rec.h)
      table.insert(out, rec.r)
      entry(4, rec.y, 'sent', {'holder', rec.h})
    end
  end
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('ZREM', KEYS[3], ARGV[1])
else
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[4]), ARGV[1])
end
return out
