-- A reserved call that will not start now (its key is paused): its reservation given
-- back and it leaves the room (it comes round as a new call once let go).
-- KEYS[1..8] the room (includes/turns.lua)
-- ARGV[1] the room's line prefix   ARGV[2] the call's ident   ARGV[3] the total's slots
-- returns 1 given back, 0 it held no reservation
--- @include "turns"
local ident = ARGV[2]
if not redis.call('ZSCORE', KEYS[5], ident) then return 0 end
local _, reserved = scan_total(tonumber(ARGV[3]))
local slot_n = reserved[ident]
if slot_n then redis.call('DEL', KEYS[7] .. ':slot' .. slot_n) end
redis.call('ZREM', KEYS[5], ident)
redis.call('HDEL', KEYS[2], ident)
redis.call('HDEL', KEYS[3], ident)
return 1
