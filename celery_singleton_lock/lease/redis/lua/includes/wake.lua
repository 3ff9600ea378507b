-- Wake one waiter, only if a blocking waiter announced itself: the common path (nobody
-- blocks) then writes no signal keys at all. The signal is a one-element list that a
-- blocked BLPOP pops, FIFO among waiters; it expires so a wake-up nobody consumed does
-- not linger. Shared by release.lua and release_matching.lua; not a script by itself.
local function wake(signal_key, waiters_key, signal_ttl)
  if redis.call('EXISTS', waiters_key) == 0 then return end
  redis.call('DEL', signal_key)
  redis.call('RPUSH', signal_key, '1')
  redis.call('PEXPIRE', signal_key, signal_ttl)
end
