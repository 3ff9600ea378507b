-- LPUSH with a note (a lock store on another server: the hold was taken there).
--
-- KEYS[1] the list  KEYS[2..6] the notes'  KEYS[7..] lists to expire too
-- ARGV[1] payload  ARGV[2] expiry ms ('' for none)  ARGV[3] the note's spec
-- returns 1
--- @include "note"
redis.call('LPUSH', KEYS[1], ARGV[1])
if ARGV[2] ~= '' then
  for i = 7, #KEYS do redis.call('PEXPIRE', KEYS[i], ARGV[2]) end
end
note(2, ARGV[3], KEYS[1], ARGV[1])
return 1
