-- Hand a lock from one holder to another, only if that holder has it now (never when
-- it is free): a queued message's hold passed to the message that replaces it.
-- KEYS[1] lock key     KEYS[2] its replaced set (see acquire.lua's ARGV[8])
-- ARGV[1] expected holder   ARGV[2] new token   ARGV[3] ttl in ms
-- ARGV[4] what to record as replaced (the expected holder, or a name for it)
-- returns {1, 0}                swapped (unfenced); ARGV[4] recorded as replaced for as
--                               long as the new holder's ttl at least
--         {0, holder, pttl}     held by another ('' when free; pttl -2 then)
--- @include "hand_on"
local current = redis.pcall('GET', KEYS[1])
if current == ARGV[1] then
  pass_to(ARGV[2], ARGV[3], ARGV[4])
  return {1, 0}
end
if type(current) ~= 'string' then current = '' end
return {0, current, redis.call('PTTL', KEYS[1])}
