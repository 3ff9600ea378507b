-- A call with an idempotency key ends: its run's outcome is recorded, or the key is freed.
--
-- Only the call the record names may end it (owner-checked): a run the record says is
-- running, or the call it accepted. A record taken over by another run, or gone with
-- its window, is left as it is.
--
-- KEYS[1] the key's record
-- ARGV[1] the call's id
-- ARGV[2] 'succeeded' or 'failed' (a run's outcome, kept for the window); 'forget' (a
-- run that did not complete, or one accepted that never ran: the key is free again);
-- 'unsent' (a dispatch that sent nothing after all: freed only if no run began)
-- returns 1 written (or deleted), 0 the record is not this call's to end
local found = redis.call('HMGET', KEYS[1], 'call', 'state', 'by')
local running = found[2] == 'running' and found[3] == ARGV[1]
local accepted = found[2] == 'accepted' and found[1] == ARGV[1]
if ARGV[2] == 'forget' or ARGV[2] == 'unsent' then
  if not (accepted or (running and ARGV[2] == 'forget')) then return 0 end
  redis.call('DEL', KEYS[1])
  return 1
end
if not running then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[2])
return 1
