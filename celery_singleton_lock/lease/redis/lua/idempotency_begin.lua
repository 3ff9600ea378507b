-- A run of a call with an idempotency key starts: the record says it runs, or why it must not.
--
-- Called by a run that holds its key's running lease, so no other run of the same call
-- is alive: a record left running by another call was left by a run that died, and
-- this one takes it over. A record already ended (succeeded, or failed and kept) or
-- bound to other arguments is left as it is: the caller answers from it instead of
-- running. With no record (its window passed, or the call was sent without a claim:
-- send_task, beat), this run is the first.
--
-- KEYS[1] the key's record
-- ARGV[1] this run's call id   ARGV[2] its fingerprint   ARGV[3] the window in milliseconds
-- ARGV[4] the task's name
-- returns {runs, call, fingerprint, state, by} with the record as it was before this
-- call (state '' when there was none); runs 1 when the record now says this run is
-- running, 0 when it was left as it is
local found = redis.call('HMGET', KEYS[1], 'call', 'fingerprint', 'state', 'by')
if not found[1] then
  local t = redis.call('TIME')
  local at = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('HSET', KEYS[1], 'call', ARGV[1], 'fingerprint', ARGV[2], 'state', 'running',
    'by', ARGV[1], 'task', ARGV[4], 'at', at)
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {1, ARGV[1], ARGV[2], '', ''}
end
local state = found[3] or ''
if found[2] ~= ARGV[2] or state == 'succeeded' or state == 'failed' then
  return {0, found[1], found[2] or '', state, found[4] or ''}
end
redis.call('HSET', KEYS[1], 'state', 'running', 'by', ARGV[1])
return {1, found[1], found[2], state, found[4] or ''}
