-- Redlock's second step (lease/redlock/masters.py): the lease's fence written back on every master.
-- KEYS[1] lock key    KEYS[2] fence key
-- ARGV[1] owner token   ARGV[2] the lease's fence   ARGV[3] ttl in milliseconds
-- Raises the master's last fence to the lease's (never lowers it) and keeps it at least
-- as long as the lock; returns 1 if the token still holds the lock here, else 0.
local last = tonumber(redis.call('GET', KEYS[2]))
if last == nil or last < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
elseif redis.call('PTTL', KEYS[2]) < tonumber(ARGV[3]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
if redis.call('GET', KEYS[1]) == ARGV[1] then return 1 end
return 0
