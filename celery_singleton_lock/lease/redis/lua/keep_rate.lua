-- A name's rate key kept for at least ARGV[1] milliseconds more (lease/limits/rates.py,
-- Rates.keep): a run a pause kept waiting goes round again, and the schedule it was given
-- its slot on must still be there when the resume moves it on (rate.lua). The key's own
-- expiry (once every TAT has passed) is never shortened, and a name with no key is left
-- without one: nothing was reserved, so nothing has to move. (PEXPIRE's GT option would
-- say this in one call, but a Redis 6.2 server has none.)
-- KEYS[1] the name's rate key   ARGV[1] milliseconds
-- returns 1 kept longer   0 no key, or kept as long already
local left = redis.call('PTTL', KEYS[1])
local wanted = tonumber(ARGV[1])
if left == -2 or left == -1 or left >= wanted then return 0 end
redis.call('PEXPIRE', KEYS[1], wanted)
return 1
