-- Let one more call wait for a name, unless as many as its cap wait already (max_pending).
--
-- The calls waiting are a sorted set beside the name's lock: member a call's id, score
-- when it stops counting if nothing takes it out (its run starting does: ZREM), so a
-- call whose message was lost frees its place by itself. A call already in (a deferral,
-- a retry of a dispatch whose reply was lost) keeps its place and has its time renewed;
-- so does one sent round again whose place ran out ('renew': it is never refused).
-- KEYS[1] the name's backlog
-- ARGV[1] the call's id   ARGV[2] the cap   ARGV[3] how long it counts, in milliseconds
-- ARGV[4] 'enter' or 'renew'
-- returns {1, waiting} let in (waiting: with it), or {0, waiting, ms until the place
-- that frees first frees by itself}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local waiting = redis.call('ZCARD', KEYS[1])
local known = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not known and ARGV[4] ~= 'renew' and waiting >= tonumber(ARGV[2]) then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, waiting, tonumber(first[2]) - now}
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
-- The set ends with its last place, which may be another call's, kept longer than this
-- one's (a place renewed for its slot's wait): never with this call's.
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], tonumber(last[2]))
if known then return {1, waiting} end
return {1, waiting + 1}
