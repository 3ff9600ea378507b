-- Drop the notes of messages whose holds moved on.
--
-- KEYS[1..5] the notes'  ARGV the members to forget (their holds moved on)
-- returns how many members were asked for
--- @include "forget"
for _, member in ipairs(ARGV) do forget(member) end
return #ARGV
