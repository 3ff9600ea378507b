-- A task's total slot freed (a run's end; a sweep finds one expired): the run's total
-- slot released, and the free slots handed out to the waiting keys in turn.
-- KEYS[1..9] the room (includes/turns.lua)   KEYS[10] the rooms with calls (a set)
-- ARGV[1] the room's line prefix   ARGV[2] the ending run's total slot ('' for none)
-- ARGV[3] the ending run's token ('' for none: a sweep)   ARGV[4] a reservation's ms
-- ARGV[5] the total's slots   ARGV[6] the room's name (in KEYS[10])
-- returns {ident1, message1, stamp1, ...}: calls whose turn came, to be sent (each
--         message with its stamp)
--- @include "turns"
local ending = ARGV[3]
if ARGV[2] ~= '' and ending ~= '' and redis.call('GET', ARGV[2]) == ending then
  redis.call('DEL', ARGV[2])
end
local free, reserved = scan_total(tonumber(ARGV[5]))
local handed = hand_out(free, reserved, ending, tonumber(ARGV[4]))
if redis.call('HLEN', KEYS[2]) == 0 then redis.call('SREM', KEYS[10], ARGV[6]) end
settle()
return handed
