-- A received message's note cleared, in the pipeline that records it as unacked.
--
-- KEYS[1..5] the notes'  ARGV[1] its member. Its number counts as received for its list.
-- returns 1 cleared   0 not noted (cleared before, or never noted)
--- @include "clear"
return clear(ARGV[1])
