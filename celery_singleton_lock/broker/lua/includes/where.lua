-- Where a noted message is, the notes' keys being KEYS[1..5] and kombu's unacked hash
-- KEYS[6]: 'queued' (or maybe: its list is long and it is not among the 1,000 popped
-- next), 'unacked', or 'gone' (popped and never recorded). Bounded: never more than
-- 1,000 list entries read. Not a script itself.
local function where(member, r)
  if redis.call('HEXISTS', KEYS[6], member) == 1 then return 'unacked' end
  local popped = tonumber(redis.call('HGET', KEYS[5], r[3]) or 0)
  local length = redis.call('LLEN', r[3])
  if length == 0 then return 'gone' end
  -- A message pushed again (r[8]) waits at the end popped next, behind nothing: its
  -- number is older than what was received since, so only a look at that end tells.
  if popped >= r[7] and not r[8] then return 'gone' end
  local payload = redis.call('HGET', KEYS[3], member)
  local found = redis.pcall('LPOS', r[3], payload, 'RANK', -1, 'MAXLEN', 1000)
  if type(found) == 'table' then
    -- Redis < 6.0.6 has no LPOS: the 1,000 entries popped next, read.
    found = false
    for _, v in ipairs(redis.call('LRANGE', r[3], -1000, -1)) do
      if v == payload then found = true end
    end
  end
  if found or (length > 1000 and not r[8]) then return 'queued' end
  return 'gone'
end
