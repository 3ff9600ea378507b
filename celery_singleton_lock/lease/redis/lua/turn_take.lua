-- A call of a task with round-robin total_limit turns at its start: it takes its turn
-- if the room hands it one now, else its message is kept in its key's line (once: a
-- redelivered copy is not kept twice); the total's free slots are handed out meanwhile.
-- KEYS[1..8] the room (includes/turns.lua)   KEYS[9] the rooms with calls (a set)
-- ARGV[1] the room's line prefix   ARGV[2] the call's ident   ARGV[3] its key's name
-- ARGV[4] its key as "tag\twidest\tcap\tweight"   ARGV[5] its kept message
-- ARGV[6] its running token   ARGV[7] the run's ttl ms   ARGV[8] a reservation's ms
-- ARGV[9] the total's slots   ARGV[10] the room's name (in KEYS[9])
-- ARGV[11] how long a call's other message is dropped once one claimed its turn, ms
-- ARGV[12] '1': this is the call's message sent on its turn; '0': as first sent
-- returns {1, key fence, key slot, total fence, total slot, handed...}: it runs now
--         {2, 0, 0, 0, 0, handed...}: kept, it waits for its turn
--         {3, 0, 0, 0, 0}: its turn is reserved, its key's slot not free yet (ask again)
--         {4, 0, 0, 0, 0}: another message of a call whose turn one of them claimed
--                          (the one it was kept from, delivered again as its worker
--                          died before the ack; or the one sent on its turn): dropped
-- handed: ident1, message1, ...: calls whose turn came, to be sent
--- @include "turns"
local ident, name, handed_now = ARGV[2], ARGV[3], ARGV[12] == '1'
-- Which of a call's two messages claimed its turn ('h:' sent on it, 'o:' the first).
local mine, other = (handed_now and 'h:' or 'o:') .. ident, (handed_now and 'o:' or 'h:') .. ident
redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', now_ms())
if redis.call('ZSCORE', KEYS[8], other) then return {4, 0, 0, 0, 0} end
local free, reserved = scan_total(tonumber(ARGV[9]))
if redis.call('ZSCORE', KEYS[5], ident) then
  local slot_n = reserved[ident]
  if slot_n then
    local taken = claim(ident, slot_n, parse_info(ARGV[4]), ARGV[6], ARGV[7])
    if taken == nil then return {3, 0, 0, 0, 0} end
    redis.call('ZADD', KEYS[8], now_ms() + tonumber(ARGV[11]), mine)
    return {1, taken[1], taken[2], taken[3], taken[4]}
  end
  put_back(ident)
elseif redis.call('HEXISTS', KEYS[2], ident) == 0 then
  redis.call('HSET', KEYS[4], name, ARGV[4])
  redis.call('HSET', KEYS[2], ident, ARGV[5])
  redis.call('HSET', KEYS[3], ident, name)
  redis.call('RPUSH', ARGV[1] .. string.match(ARGV[4], '^(.*)\t%d+\t%d+\t[^\t]+$'), ident)
  redis.call('SADD', KEYS[9], ARGV[10])
  enter(name)
end
local handed = hand_out(free, reserved, '', tonumber(ARGV[8]))
local reply = {2, 0, 0, 0, 0}
for i = 1, #handed, 2 do
  local taken = nil
  if handed[i] == ident then
    local _, now_reserved = scan_total(tonumber(ARGV[9]))
    taken = claim(ident, now_reserved[ident], parse_info(ARGV[4]), ARGV[6], ARGV[7])
  end
  if taken ~= nil then
    reply[1], reply[2], reply[3], reply[4], reply[5] = 1, taken[1], taken[2], taken[3], taken[4]
    redis.call('ZADD', KEYS[8], now_ms() + tonumber(ARGV[11]), mine)
  else  -- (its own, its key's slot not free after all: sent, to claim as it comes)
    table.insert(reply, handed[i])
    table.insert(reply, handed[i + 1])
  end
end
return reply
