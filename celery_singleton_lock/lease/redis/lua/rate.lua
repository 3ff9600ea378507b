-- A name's rate limits by GCRA (lease/limits/rates.py): per limit two numbers on the
-- server's clock, the theoretical arrival time (TAT) of the next call's slot (the
-- schedule calls reserve their slots on) and of the next run's start (the gate every
-- run passes as it starts). Every limit is decided in this one script: a call is
-- charged against all of them or none.
-- KEYS[1] the name's rate key: each limit's schedule TAT in microseconds, in the limits'
--   order, comma-separated (a limit is its place in the list: a rate changed in place
--   keeps its schedule; one added starts with none), then ';' and each limit's start
--   TAT, then '|' and the last resume applied
-- ARGV[1] 'take', 'reserve' or 'peek' (a slot on the schedule, at dispatch); 'start'
--   (a run with no slot: the next free one, waited for if near, else reserved) or 'due'
--   (a run with the slot ARGV[2] reserved earlier: early, on it, or late)
-- ARGV[2] ('due' only) the slot reserved earlier, in microseconds; else 0
-- ARGV[3] ARGV[4] the name's last pause: when it began and ended (0 0: none). Time stood
--   still for the name meanwhile: once, every TAT past its start moves on by its length,
--   as the paused runs and the slots reserved before it do (run/admission.py)
-- ARGV[5] ('due') the grace, in microseconds: how late a run may start on its slot; -1
--   (a run a pause kept waiting, as late as every other it kept waiting) on its slot however late
-- ARGV[6] ('start', 'due') how near, in microseconds, a slot must be for the run to wait
--   for it where it is (answered 1, with the wait) rather than be sent round to it
-- ARGV[7..] three per limit: its interval between calls (period / limit) and its
--   burst tolerance ((burst - 1) * interval), in microseconds, and the units this call
--   costs against it
-- returns {state, slot, wait, remaining, now, free, limiting}: state 1 now (a run: on
-- its slot, maybe after waiting for it there), 2 a later slot reserved (due: not yet
-- due, or given a new one), 0 refused (take) or not free now (peek); slot the slot's
-- server time (a run's start: its slot, or when the gate let it in); wait microseconds
-- until it; remaining the one-unit calls that may start now after this one under every
-- limit; now the server's time; free the next one-unit call's earliest slot; limiting
-- the limit (1-based) that set the slot. A run's start (state 1 of 'start' or 'due')
-- adds two: the key as this start left it and as it was before it, for a start that
-- does not happen after all (a call kept waiting for its turn) to be given back exactly
-- while nothing else changed the key (turn_take.lua).
--
-- Why a gate beside the schedule: a run that comes later than its grace (its worker was
-- saturated, or died holding it) cannot start on its slot without bunching with the runs
-- after it. It starts as soon as the runs that started leave room (the gate) if that is
-- near, else it is given the next free slot. Without the gate a late run could only take a new slot,
-- and on a worker that stays behind every run is late again: each slot passes unused and
-- nothing runs. The gate counts the slots runs started on, so no window of them holds
-- more than the schedule allows, and a slot nobody came for is not lost.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local stored, gates, applied = {}, {}, 0
local value = redis.call('GET', KEYS[1])
if value then
  local bar = string.find(value, '|', 1, true)
  if bar then
    applied = tonumber(string.sub(value, bar + 1))
    value = string.sub(value, 1, bar - 1)
  end
  local started = ''
  local semi = string.find(value, ';', 1, true)
  if semi then
    started = string.sub(value, semi + 1)
    value = string.sub(value, 1, semi - 1)
  end
  for tat in string.gmatch(value, '[^,]+') do stored[#stored + 1] = tonumber(tat) end
  for tat in string.gmatch(started, '[^,]+') do gates[#gates + 1] = tonumber(tat) end
end
local how = ARGV[1]
local paused_at, resumed_at = tonumber(ARGV[3]), tonumber(ARGV[4])
local grace, near = tonumber(ARGV[5]), tonumber(ARGV[6])
local shifted = false
if resumed_at > applied then
  for _, list in ipairs({stored, gates}) do
    for i, tat in ipairs(list) do
      if tat > paused_at then list[i] = tat + (resumed_at - paused_at) end
    end
  end
  applied, shifted = resumed_at, true
end

local limits = {}
local slot, limiting = now, 1
for i = 7, #ARGV, 3 do
  local limit = {interval = tonumber(ARGV[i]), tolerance = tonumber(ARGV[i + 1]),
    cost = tonumber(ARGV[i + 2])}
  limit.tat = math.max(stored[#limits + 1] or now, now)
  limit.gate = gates[#limits + 1] or 0
  -- The earliest this call's units fit: its increment, less the burst's tolerance (a
  -- call that costs a limit nothing is not kept waiting by it).
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
  -- the one-unit calls every limit lets start now after this one, and when the next may:
  -- by the schedule and the gate both (a late run that started at the gate's opening
  -- moved the gate past the schedule)
  local left, free = nil, now
  for i, limit in ipairs(limits) do
    local ahead = math.max(tats[i], limit.gate)
    local room = 0
    if now + limit.tolerance >= ahead then
      room = math.floor((now + limit.tolerance - ahead) / limit.interval) + 1
    end
    if left == nil or room < left then left = room end
    free = math.max(free, ahead - limit.tolerance)
  end
  return {state, at, math.max(0, at - now), left or 0, now, free, limiting}
end

local function encoded(tats, gate_of)
  local kept, started, ttl = {}, {}, 1
  for i, tat in ipairs(tats) do
    local gate = gate_of(i)
    kept[i] = string.format('%.0f', tat)
    started[i] = string.format('%.0f', gate)
    ttl = math.max(ttl, math.ceil((math.max(tat, gate) - now) / 1000) + 1)
  end
  local text = table.concat(kept, ',') .. ';' .. table.concat(started, ',')
  if applied > 0 then text = text .. '|' .. string.format('%.0f', applied) end
  return text, ttl
end
local function gate_now(i) return limits[i] and limits[i].gate or gates[i] or 0 end

local function save(tats)
  local text, ttl = encoded(tats, gate_now)
  redis.call('SET', KEYS[1], text, 'PX', ttl)
  return text
end

-- The gate: the earliest a run may start (its units within every limit's burst, counted
-- from the starts before it), and a start charged to it. Runs that come on their slots,
-- in order, pass it exactly as the schedule let them.
local function opens()
  local at = 0
  for _, limit in ipairs(limits) do
    if limit.cost > 0 then
      at = math.max(at, limit.gate + (limit.cost - 1) * limit.interval - limit.tolerance)
    end
  end
  return at
end
local function started(at)
  for _, limit in ipairs(limits) do
    if limit.cost > 0 then
      limit.gate = math.max(limit.gate, at) + limit.cost * limit.interval
    end
  end
end

local tats = {}
for i, limit in ipairs(limits) do tats[i] = limit.tat end
local reserved = tonumber(ARGV[2])
if how == 'peek' or (how == 'take' and slot > now) or (how == 'due' and reserved > now + near) then
  if shifted then save(stored) end  -- the resume's move, made once
  if how == 'due' then return answer(2, reserved, tats) end  -- early: counts nothing
  return answer(slot > now and 0 or 1, slot, tats)
end
-- A run's start ('start', 'due'): the slot it starts on, or nil if none is near.
local at = nil
if how == 'due' then
  -- On its slot if it came within its grace (the slot was counted when it was
  -- reserved), else the gate's next opening if near.
  local gate = opens()
  if (grace < 0 or now - reserved <= grace) and gate <= reserved then
    at = reserved
  elseif math.max(gate, now) <= now + near then
    at = math.max(gate, now)
  else
    slot = math.max(slot, gate)
  end
elseif how == 'start' then
  slot = math.max(slot, opens())
  if slot <= now + near then at = math.max(slot, now) end
end
-- The key as it was before this start: what giving the start back writes.
local before = nil
if at then
  local was = {}
  for i, limit in ipairs(limits) do was[i] = limit.gate end
  before = encoded(tats, function(i) return was[i] or gates[i] or 0 end)
  started(at)
end
local function started_reply(reply, left)
  if before then
    reply[#reply + 1] = left
    reply[#reply + 1] = before
  end
  return reply
end
if how == 'due' and at then
  return started_reply(answer(1, at, tats), save(tats))
end
-- Charged against every limit at the slot: a limit that had room then still counts it.
for i, limit in ipairs(limits) do
  if limit.cost > 0 then
    tats[i] = math.max(limit.tat, slot) + limit.cost * limit.interval
  end
end
local left = save(tats)
return started_reply(answer((at or slot <= now) and 1 or 2, at or slot, tats), left)
