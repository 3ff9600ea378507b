-- A hold taken in the same step as the push of the message it holds for (a broker's
-- queue on the same server): there is never a hold without its message, nor the
-- message without its hold.
-- KEYS[1] hold (lock) key  KEYS[2] the list to push to  KEYS[3..7] the notes' keys
-- KEYS[8..] lists to expire too  ARGV[1] owner token  ARGV[2] ttl in ms  ARGV[3] payload
-- ARGV[4] the list's database ('' for the lock's own)  ARGV[5] expiry ms ('' for none)
-- ARGV[6] the lock's database  ARGV[7] the note's spec ('' for none)
-- returns {1, 0}               held and pushed; or held by this very token already (a
--                              retry whose reply was lost: pushed then, not again)
--         {0, holder, pttl}    held by `holder` ('' when foreign); nothing pushed
-- The push goes first: no rollback, so a push the server refuses (an ACL user without the
-- queue's keys) finds nothing written. SELECT in a script switches only its database.
--- @include "push"
local current = redis.pcall('GET', KEYS[1])
if current then
  if current == ARGV[1] then return {1, 0} end
  if type(current) ~= 'string' then current = '' end
  return {0, current, redis.call('PTTL', KEYS[1])}
end
push(2, ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, 0}
