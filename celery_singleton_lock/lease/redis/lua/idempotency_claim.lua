-- Bind an idempotency key to the first call that names it: its id and fingerprint, for a window.
--
-- A record is a hash: call (the first call's id), fingerprint (its task and arguments),
-- state (accepted, running, succeeded or failed), by (the call whose run set the state),
-- task (the task's name) and at (when it was accepted, server ms). It expires with the
-- window, counted from the first call; no later write moves that.
--
-- KEYS[1] the key's record
-- ARGV[1] this call's id   ARGV[2] its fingerprint   ARGV[3] the window in milliseconds
-- ARGV[4] the task's name
-- returns {1, call, fingerprint, state, by} when this call is the first (recorded now,
-- or by an earlier try of this same call whose reply was lost), {0, call, fingerprint,
-- state, by} with the record as it is when another call was first
local found = redis.call('HMGET', KEYS[1], 'call', 'fingerprint', 'state', 'by')
if found[1] then
  local again = found[1] == ARGV[1] and found[3] == 'accepted'
  return {again and 1 or 0, found[1], found[2] or '', found[3] or '', found[4] or ''}
end
local t = redis.call('TIME')
local at = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'call', ARGV[1], 'fingerprint', ARGV[2], 'state', 'accepted',
  'task', ARGV[4], 'at', at)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1, ARGV[1], ARGV[2], 'accepted', ''}
