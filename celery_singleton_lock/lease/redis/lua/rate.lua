-- A per-name rate limit by GCRA (lease/limits/rates.py): one number, the next call's theoretical
-- arrival time, on the server's clock.
-- KEYS[1] the name's rate key
-- ARGV[1] the interval between calls in microseconds (period / limit)
-- ARGV[2] the burst tolerance in microseconds ((burst - 1) * interval)
-- ARGV[3] 'take', 'reserve', 'peek' or 'due'
-- ARGV[4] ('due' only) a slot reserved earlier, in microseconds
-- returns {state, slot, wait, remaining, now, free}: state 1 now, 2 a later slot
-- reserved (due: not yet due), 0 refused (take) or not free now (peek); slot the slot's
-- server time in microseconds; wait microseconds until it; remaining the calls that may
-- start now after this one; now the server's time; free the next call's earliest slot.
-- 'due' counts nothing: the slot was counted when it was reserved.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval, tolerance = tonumber(ARGV[1]), tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local function answer(state, slot, next_tat)
  -- the calls that may start now after this one, and when the next one may
  local left = 0
  if now + tolerance >= next_tat then
    left = math.floor((now + tolerance - next_tat) / interval) + 1
  end
  return {state, slot, math.max(0, slot - now), left, now, math.max(now, next_tat - tolerance)}
end
if ARGV[3] == 'due' then
  local reserved = tonumber(ARGV[4])
  return answer(reserved > now and 2 or 1, reserved, tat)
end
local slot = math.max(now, tat - tolerance)
if ARGV[3] == 'peek' or (ARGV[3] == 'take' and slot > now) then
  return answer(slot > now and 0 or 1, slot, tat)
end
local next_tat = tat + interval
redis.call('SET', KEYS[1], string.format('%.0f', next_tat), 'PX',
  math.ceil((next_tat - now) / 1000) + 1)
return answer(slot > now and 2 or 1, slot, next_tat)
