-- A name's rate limits by GCRA (lease/limits/rates.py): per limit one number, the next
-- call's theoretical arrival time (TAT), on the server's clock. Every limit is decided
-- in this one script: a call is charged against all of them or none.
-- KEYS[1] the name's rate key: each limit's TAT in microseconds, in the limits' order,
--   comma-separated (a limit is its place in the list: a rate changed in place keeps
--   its schedule; one added starts with none), then '|' and the last resume applied
-- ARGV[1] 'take', 'reserve', 'peek' or 'due'
-- ARGV[2] ('due' only) a slot reserved earlier, in microseconds; else 0
-- ARGV[3] ARGV[4] the name's last pause: when it began and ended (0 0: none). Time stood
--   still for the name meanwhile: once, every TAT past its start moves on by its length,
--   as the runs held back and the slots reserved before it do (run/execution.py)
-- ARGV[5..] three per limit: its interval between calls (period / limit) and its
--   burst tolerance ((burst - 1) * interval), in microseconds, and the units this call
--   costs against it
-- returns {state, slot, wait, remaining, now, free, limiting}: state 1 now, 2 a later
-- slot reserved (due: not yet due), 0 refused (take) or not free now (peek); slot the
-- slot's server time; wait microseconds until it; remaining the one-unit calls that may
-- start now after this one under every limit; now the server's time; free the next
-- one-unit call's earliest slot; limiting the limit (1-based) that set the slot.
-- 'due' counts nothing: the slot was counted when it was reserved.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local stored, applied = {}, 0
local value = redis.call('GET', KEYS[1])
if value then
  local bar = string.find(value, '|', 1, true)
  if bar then
    applied = tonumber(string.sub(value, bar + 1))
    value = string.sub(value, 1, bar - 1)
  end
  for tat in string.gmatch(value, '[^,]+') do
    stored[#stored + 1] = tonumber(tat)
  end
end
local paused_at, resumed_at = tonumber(ARGV[3]), tonumber(ARGV[4])
local shifted = false
if resumed_at > applied then
  for i, tat in ipairs(stored) do
    if tat > paused_at then stored[i] = tat + (resumed_at - paused_at) end
  end
  applied, shifted = resumed_at, true
end

local limits = {}
local slot, limiting = now, 1
for i = 5, #ARGV, 3 do
  local limit = {interval = tonumber(ARGV[i]), tolerance = tonumber(ARGV[i + 1]),
    cost = tonumber(ARGV[i + 2])}
  limit.tat = math.max(stored[#limits + 1] or now, now)
  -- The earliest this call's units fit: its increment, less the burst's tolerance (a
  -- call that costs a limit nothing is not held back by it).
  local at = now
  if limit.cost > 0 then
    at = math.max(now, limit.tat + (limit.cost - 1) * limit.interval - limit.tolerance)
  end
  if at > slot then
    slot, limiting = at, #limits + 1
  end
  limits[#limits + 1] = limit
end

local function answer(state, at, tats)
  -- the one-unit calls every limit lets start now after this one, and when the next may
  local left, free = nil, now
  for i, limit in ipairs(limits) do
    local room = 0
    if now + limit.tolerance >= tats[i] then
      room = math.floor((now + limit.tolerance - tats[i]) / limit.interval) + 1
    end
    if left == nil or room < left then left = room end
    free = math.max(free, tats[i] - limit.tolerance)
  end
  return {state, at, math.max(0, at - now), left or 0, now, free, limiting}
end

local function save(tats)
  local kept, ttl = {}, 1
  for i, tat in ipairs(tats) do
    kept[i] = string.format('%.0f', tat)
    ttl = math.max(ttl, math.ceil((tat - now) / 1000) + 1)
  end
  local text = table.concat(kept, ',')
  if applied > 0 then text = text .. '|' .. string.format('%.0f', applied) end
  redis.call('SET', KEYS[1], text, 'PX', ttl)
end

local tats = {}
for i, limit in ipairs(limits) do tats[i] = limit.tat end
if ARGV[1] == 'due' or ARGV[1] == 'peek' or (ARGV[1] == 'take' and slot > now) then
  if shifted then save(stored) end  -- the resume's move, made once
  if ARGV[1] == 'due' then
    local reserved = tonumber(ARGV[2])
    return answer(reserved > now and 2 or 1, reserved, tats)
  end
  return answer(slot > now and 0 or 1, slot, tats)
end
-- Charged against every limit at the slot: a limit that had room then still counts it.
for i, limit in ipairs(limits) do
  if limit.cost > 0 then
    tats[i] = math.max(limit.tat, slot) + limit.cost * limit.interval
  end
end
save(tats)
return answer(slot > now and 2 or 1, slot, tats)
