-- A call with an idempotency key ends: its run's outcome is recorded, or the key is freed.
--
-- Only the call the record names may end it (owner-checked): a run the record says is
-- running, or (to forget) the call it accepted but never ran (refused as a duplicate,
-- or not published). A record taken over by another run, or gone with its window, is
-- left as it is.
--
-- KEYS[1] the key's record
-- ARGV[1] the call's id   ARGV[2] 'succeeded', 'failed' (kept for the window) or 'forget'
-- returns 1 written (or deleted), 0 the record is not this call's to end
local found = redis.call('HMGET', KEYS[1], 'call', 'state', 'by')
local running = found[2] == 'running' and found[3] == ARGV[1]
local accepted = found[2] == 'accepted' and found[1] == ARGV[1]
if ARGV[2] == 'forget' then
  if not (running or accepted) then return 0 end
  redis.call('DEL', KEYS[1])
  return 1
end
if not running then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[2])
return 1
