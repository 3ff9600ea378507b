-- Look at the notes that are due: which noted messages were popped and never recorded.
--
-- KEYS[1..5] the notes'  KEYS[6] kombu's unacked hash  ARGV[1] wait ms  ARGV[2] how many
-- returns {member, name, token} of each message gone for a wait: to push again if its
-- hold still stands (push_again.lua), else to forget (forget_notes.lua). A message still queued is
-- looked at less often the longer it waits; one unacked, or past its hold, is forgotten.
--- @include "forget"
--- @include "where"
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local wait = tonumber(ARGV[1])
local missing = {}
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ms, 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(due) do
  local raw = redis.call('HGET', KEYS[2], member)
  local r = raw and cjson.decode(raw)
  local state = (r and ms < r[6]) and where(member, r) or 'unacked'
  if state == 'unacked' then
    forget(member)
  else
    local next_look = ms + wait
    if state == 'queued' then
      r[5] = 0
      next_look = ms + math.max(wait, ms - r[4])
    elseif r[5] == 0 then
      r[5] = ms
    elseif ms - r[5] >= wait then
      table.insert(missing, {member, r[1], r[2]})
    end
    redis.call('HSET', KEYS[2], member, cjson.encode(r))
    redis.call('ZADD', KEYS[1], next_look, member)
  end
end
return missing
