-- Push again the noted messages still gone (their holds still stand).
--
-- KEYS[1..5] the notes'  KEYS[6] kombu's unacked hash (as sweep.lua)
-- ARGV the members whose holds still stand
-- returns the members pushed again
-- Each still noted, seen gone before and gone now is pushed again, at the end popped
-- next, keeping its number and marked pushed again (r[8]): a number of its own would be
-- newer than the messages still queued, whose receipt it would then seem to prove.
--- @include "where"
local pushed = {}
for _, member in ipairs(ARGV) do
  local raw = redis.call('HGET', KEYS[2], member)
  local r = raw and cjson.decode(raw)
  if r and r[5] ~= 0 and where(member, r) == 'gone' then
    redis.call('RPUSH', r[3], redis.call('HGET', KEYS[3], member))
    r[5] = 0
    r[8] = 1
    redis.call('HSET', KEYS[2], member, cjson.encode(r))
    table.insert(pushed, member)
  end
end
return pushed
