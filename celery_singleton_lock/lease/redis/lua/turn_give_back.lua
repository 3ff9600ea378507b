-- A reserved call that will not start now gives its turn back. Its key paused, its
-- rate deferring it, its message expired: it leaves the room (its message comes round
-- with its stamp, as a new call once let go). Its key's slot not free for a while (its
-- key at a limit an operator lowered): it stays, first in its key's line. A copy
-- (another stamp) gives nothing back.
-- KEYS[1..9] the room (includes/turns.lua)
-- ARGV[1] the room's line prefix   ARGV[2] the call's ident   ARGV[3] the total's slots
-- ARGV[4] the stamp of the message giving it back ('': whichever)
-- ARGV[5] how long a call's stamp is kept once it left the room, ms
-- ARGV[6] '1': it stays in line; '0': it leaves the room
-- returns 1 given back, 0 it held no reservation
--- @include "turns"
local ident, stamp = ARGV[2], ARGV[4]
if not redis.call('ZSCORE', KEYS[5], ident) then return 0 end
if stamp ~= '' and redis.call('HGET', KEYS[9], ident) ~= stamp then return 0 end
local _, reserved = scan_total(tonumber(ARGV[3]))
local slot_n = reserved[ident]
if slot_n then redis.call('DEL', KEYS[7] .. ':slot' .. slot_n) end
if ARGV[6] == '1' then
  put_back(ident)
else
  leave(ident, tonumber(ARGV[5]))
end
settle()
return 1
