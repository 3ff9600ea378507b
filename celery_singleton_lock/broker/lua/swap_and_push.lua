-- swap.lua and the push of the replacing message in one step (a broker's queue on the lock
-- store's server): the message is pushed only if the hold passes to it.
-- KEYS[1] lock key  KEYS[2] its replaced set  KEYS[3] the list to push to  KEYS[4..8]
-- the notes'  KEYS[9..] lists to expire too  ARGV[1] expected holder  ARGV[2] new token
-- ARGV[3] ttl in ms  ARGV[4] record  ARGV[5] the payload  ARGV[6] the list's database
-- ('' for the lock's own)  ARGV[7] expiry ms ('' for none)  ARGV[8] the lock's database
-- ARGV[9] the note's spec ('' for none). Returns as swap.lua; {1, 0} too
-- when the new token holds it already (a retry whose reply was lost). Push first, as in hold_and_push.lua.
--- @include "push"
--- @include "hand_on"
local current = redis.pcall('GET', KEYS[1])
if current == ARGV[2] then return {1, 0} end
if current ~= ARGV[1] then
  if type(current) ~= 'string' then current = '' end
  return {0, current, redis.call('PTTL', KEYS[1])}
end
push(3, ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9])
pass_to(ARGV[2], ARGV[3], ARGV[4])
return {1, 0}
