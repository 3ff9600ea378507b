-- A call of a task with round-robin total_limit turns at its start: it takes its turn
-- if the room hands it one now, else its message is kept in its key's line (once: a
-- redelivered copy is not kept twice); the total's free slots are handed out meanwhile.
-- A call has one stamp at a time (KEYS[9]): a message of it with another is a copy.
-- KEYS[1..9] the room (includes/turns.lua)   KEYS[10] the rooms with calls (a set)
-- ARGV[1] the room's line prefix   ARGV[2] the call's ident   ARGV[3] its key's name
-- ARGV[4] its key as "tag\twidest\tcap\tweight"   ARGV[5] its kept message
-- ARGV[6] its running token   ARGV[7] the run's ttl ms   ARGV[8] a reservation's ms
-- ARGV[9] the total's slots   ARGV[10] the room's name (in KEYS[10])
-- ARGV[11] how long a call's stamp is kept once it left the room, ms
-- ARGV[12] this message's stamp ('0': as first sent; else the hand-out's it was sent on)
-- KEYS[11] ARGV[13] ARGV[14] (a call its rate counted a start for, rate.lua) the key's
--   rate, as that start left it and as it was before: given back where this message does
--   not start (kept, or a copy) while the rate still reads as the start left it
-- returns {1, key fence, key slot, total fence, total slot, handed...}: it runs now
--         {2, 0, 0, 0, 0, handed...}: kept, it waits for its turn
--         {3, 0, 0, 0, 0}: its turn is reserved, its key's slot not free yet (ask again)
--         {4, 0, 0, 0, 0}: a copy: the call left the room (started, gave its turn
--                          back) under another stamp: dropped
--         {5, tag, slot, holder, pttl}: its stamp's message while a running token of its
--                          task id holds the slot '<tag>:slot<n>': a copy if that run lives
-- handed: ident1, message1, stamp1, ...: calls whose turn came, to be sent
--- @include "turns"
local ident, name, stamp = ARGV[2], ARGV[3], ARGV[12]
-- A start this message does not make is not the rate's to count: GCRA keeps one number
-- per limit, so only the last start is given back (a later one built on it keeps it).
local function give_rate_back()
  if KEYS[11] and redis.call('GET', KEYS[11]) == ARGV[13] then
    redis.call('SET', KEYS[11], ARGV[14], 'KEEPTTL')
  end
end
local keep_ms = tonumber(ARGV[11])
forget_left(now_ms())
local current = redis.call('HGET', KEYS[9], ident)
local waits = redis.call('HEXISTS', KEYS[2], ident) == 1
-- While the call waits in the room any message of it may claim (one slower than a
-- reservation is as good as the one sent after it); once it left, only its stamp's.
if current and current ~= stamp and not waits then
  give_rate_back()
  return {4, 0, 0, 0, 0}
end
if current and not waits then
  -- Its stamp's message again: a copy while the call's run holds a slot (the library's
  -- copy rule decides: a live run), else the call again (its run's worker died).
  local task_id = string.match(ident, '^(.*):%d+$') or ident
  local held, n, holder = running_of(task_id, ARGV[4], tonumber(ARGV[9]))
  if held then return {5, held, n, holder, redis.call('PTTL', held .. ':slot' .. n)} end
end
-- Its key's limit as this call reads it (an operator's change reaches the hand-outs).
redis.call('HSET', KEYS[4], name, ARGV[4])
local free, reserved = scan_total(tonumber(ARGV[9]))
if redis.call('ZSCORE', KEYS[5], ident) then
  local slot_n = reserved[ident]
  if slot_n then
    local taken = claim(ident, slot_n, parse_info(ARGV[4]), ARGV[6], ARGV[7], keep_ms)
    if taken == nil then return {3, 0, 0, 0, 0} end
    redis.call('HSET', KEYS[9], ident, stamp)  -- (the message that claimed: others copies)
    settle()
    return {1, taken[1], taken[2], taken[3], taken[4]}
  end
  put_back(ident)
elseif redis.call('HEXISTS', KEYS[2], ident) == 0 then
  -- A new call, or this very message again after it left (its run's redelivery, or
  -- sent round by a pause): kept under its stamp.
  redis.call('ZREM', KEYS[8], ident)
  redis.call('HSET', KEYS[9], ident, stamp)
  redis.call('HSET', KEYS[2], ident, ARGV[5])
  redis.call('HSET', KEYS[3], ident, name)
  redis.call('RPUSH', ARGV[1] .. string.match(ARGV[4], '^(.*)\t%d+\t%d+\t[^\t]+$'), ident)
  redis.call('SADD', KEYS[10], ARGV[10])
  enter(name)
end
local handed = hand_out(free, reserved, '', tonumber(ARGV[8]))
local reply = {2, 0, 0, 0, 0}
for i = 1, #handed, 3 do
  local taken = nil
  if handed[i] == ident then
    local _, now_reserved = scan_total(tonumber(ARGV[9]))
    taken = claim(ident, now_reserved[ident], parse_info(ARGV[4]), ARGV[6], ARGV[7], keep_ms)
  end
  if taken ~= nil then  -- (this message: its stamp stays the call's, no other was sent)
    redis.call('HSET', KEYS[9], ident, stamp)
    reply[1], reply[2], reply[3], reply[4], reply[5] = 1, taken[1], taken[2], taken[3], taken[4]
  else  -- (its own, its key's slot not free after all: sent, to claim as it comes)
    table.insert(reply, handed[i])
    table.insert(reply, handed[i + 1])
    table.insert(reply, handed[i + 2])
  end
end
if reply[1] == 2 then give_rate_back() end
settle()
return reply
