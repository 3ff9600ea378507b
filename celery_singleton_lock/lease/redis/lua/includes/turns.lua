-- What the turns scripts share: a task's waiting room for its total_limit's slots.
-- The room's keys are KEYS[1..9] of every turn_*.lua:
--   KEYS[1] index: the waiting keys (a sorted set, each scored by its pass)
--   KEYS[2] calls: ident -> kept message     KEYS[3] of: ident -> its key's name
--   KEYS[4] keys: key name -> "tag\twidest\tcap\tweight" (as its latest call said)
--   KEYS[5] handed: ident -> when its reservation runs out (ms, the server's clock)
--   KEYS[6] passes: key name -> its pass as it left the index; field '' the virtual time
--   KEYS[7] the total's tag: its slots '<tag>:slot<n>', its fence '<tag>:fence'
--   KEYS[8] left: ident -> until when (ms) the stamp of a call that left the room
--           (started, given back) is kept, so its other messages are told for copies
--   KEYS[9] stamps: ident -> the call's stamp, the one message of it that may start
--           (0: as first sent; each hand-out a new one); field '' the room's last stamp;
--           field '#<ident>' how many of its reservations ran out unclaimed
-- A key's line of idents is '<ARGV[1]><its tag>' (the room's prefix: one server only),
-- and those put back, first in line, '<ARGV[1]><its tag>:again'.
-- A reservation is a total slot set to 'f|<ident>' until its call starts.

-- How many waiting keys a hand-out reads at a time, from the lowest pass.
local CHUNK = 32
-- How many reservations of a call may run out unclaimed (its message not sent, or
-- dropped where it came) before its turn is given up: it leaves the room.
local SENDS = 5

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A fence above every earlier one of fence_key's lock (as acquire_slot.lua takes it).
local function new_fence(fence_key, ttl_ms)
  local t = redis.call('TIME')
  local fence = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local last = tonumber(redis.pcall('GET', fence_key))
  if last ~= nil and last >= fence then fence = last + 1 end
  local keep = math.max(tonumber(ttl_ms), redis.call('PTTL', fence_key))
  redis.call('SET', fence_key, string.format('%.0f', fence), 'PX', keep)
  return fence
end

local function parse_info(raw)
  local tag, widest, cap, weight = string.match(raw, '^(.*)\t(%d+)\t(%d+)\t([^\t]+)$')
  return {tag = tag, widest = tonumber(widest), cap = tonumber(cap), weight = tonumber(weight)}
end

local function info_of(name)
  local raw = redis.call('HGET', KEYS[4], name)
  if not raw then return nil end
  return parse_info(raw)
end

-- A few keys that no longer wait (not in the index, no call of theirs handed out)
-- forgotten, and passes the virtual time has overtaken (worth no more than it): the
-- room stays as large as the keys waiting, not every key that ever waited.
local function prune(vt)
  for _, name in ipairs(redis.call('HRANDFIELD', KEYS[4], 2)) do
    if not redis.call('ZSCORE', KEYS[1], name) then
      local handed = false
      for _, ident in ipairs(redis.call('ZRANGE', KEYS[5], 0, -1)) do
        if redis.call('HGET', KEYS[3], ident) == name then handed = true break end
      end
      if not handed then redis.call('HDEL', KEYS[4], name) end
    end
  end
  for _, name in ipairs(redis.call('HRANDFIELD', KEYS[6], 2)) do
    if name ~= '' and (tonumber(redis.call('HGET', KEYS[6], name)) or 0) <= vt then
      redis.call('HDEL', KEYS[6], name)
    end
  end
end

-- The total's free slots, and the slot each reservation holds, by ident.
local function scan_total(total)
  local free, reserved = {}, {}
  for i = 1, total do
    local v = redis.call('GET', KEYS[7] .. ':slot' .. i)
    if not v then
      table.insert(free, i)
    elseif string.sub(v, 1, 2) == 'f|' then
      reserved[string.sub(v, 3)] = i
    end
  end
  return free, reserved
end

local function virtual_time()
  return tonumber(redis.call('HGET', KEYS[6], '')) or 0
end

-- Put name in the index if it is not there: at its pass as it left, or the virtual
-- time if that is later (a key that starts waiting neither starves others nor starves).
local function enter(name)
  if redis.call('ZSCORE', KEYS[1], name) then return end
  local pass = math.max(tonumber(redis.call('HGET', KEYS[6], name)) or 0, virtual_time())
  redis.call('HDEL', KEYS[6], name)
  redis.call('ZADD', KEYS[1], pass, name)
end

-- A reservation that ran out before its call started: the call goes back to the front
-- of its key's line (it keeps its turn).
local function put_back(ident)
  redis.call('ZREM', KEYS[5], ident)
  local name = redis.call('HGET', KEYS[3], ident)
  if not name or redis.call('HEXISTS', KEYS[2], ident) == 0 then return end
  local info = info_of(name)
  if not info then return end
  redis.call('RPUSH', ARGV[1] .. info.tag .. ':again', ident)
  enter(name)
end

-- How many more runs of a key may start now: its limit in force, less its slots held
-- (but the one of ending, a run's token as it ends) and its reservations.
local function room_of(info, ending, reserving)
  local held = 0
  for i = 1, info.widest do
    local v = redis.pcall('GET', info.tag .. ':slot' .. i)
    if v and v ~= ending then held = held + 1 end
  end
  local limit = info.cap > 0 and info.cap or info.widest
  return limit - held - reserving
end

-- The calls whose stamps are no longer kept (left the room long enough ago) forgotten.
local function forget_left(now)
  for _, ident in ipairs(redis.call('ZRANGEBYSCORE', KEYS[8], '-inf', now)) do
    if redis.call('HEXISTS', KEYS[2], ident) == 0 then redis.call('HDEL', KEYS[9], ident) end
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', now)
end

-- A call leaves the room (it started, or gave its turn back): its stamp kept keep_ms,
-- so a copy of it (another stamp) is dropped.
local function leave(ident, keep_ms)
  redis.call('ZREM', KEYS[5], ident)
  redis.call('HDEL', KEYS[9], '#' .. ident)
  redis.call('HDEL', KEYS[2], ident)
  redis.call('HDEL', KEYS[3], ident)
  redis.call('ZADD', KEYS[8], now_ms() + keep_ms, ident)
end

-- With no call in it the room's keys expire once the last stamp kept is forgotten (a
-- key's pass and weight go too); with calls in it they stay.
local function settle()
  local room = {KEYS[1], KEYS[4], KEYS[5], KEYS[6], KEYS[8], KEYS[9]}
  if redis.call('HLEN', KEYS[2]) > 0 then
    for _, key in ipairs(room) do redis.call('PERSIST', key) end
    return
  end
  local last = redis.call('ZRANGE', KEYS[8], -1, -1, 'WITHSCORES')
  local keep = math.max(1000, (tonumber(last[2]) or 0) - now_ms())
  for _, key in ipairs(room) do redis.call('PEXPIRE', key, keep) end
end

-- The waiting key of the lowest pass, from index 'from' on, that can take a slot now
-- (its limit has room), read CHUNK keys at a time; nil: none can. 'seen' keeps each
-- key's room for the script. Returns the key and its index.
local function lowest_with_room(from, seen, ending, reserving)
  local at = from
  while true do
    local listed = redis.call('ZRANGE', KEYS[1], at, at + CHUNK - 1, 'WITHSCORES')
    if #listed == 0 then return nil, at end
    local gone = 0
    for i = 1, #listed, 2 do
      local name = listed[i]
      local key = seen[name]
      if key == nil then
        key = info_of(name)
        if key then
          key.name = name
          key.room = room_of(key, ending, reserving[name] or 0)
          seen[name] = key
        else
          redis.call('ZREM', KEYS[1], name)  -- (a key whose info is gone: nothing to hand)
          gone = gone + 1
        end
      end
      if key then
        if key.room > 0 then
          key.pass = tonumber(listed[i + 1])
          return key, at + (i - 1) / 2 - gone
        end
      end
    end
    at = at + #listed / 2 - gone
  end
end

-- Hand the total's free slots out, one at a time, to the waiting key of the lowest
-- pass that has room, first in its line; its pass moves on by 1/weight. The keys ahead
-- of it have no room now (nor will in this script): each is read once, and the next
-- slot's search starts past them. Returns {ident1, message1, stamp1, ...}: each
-- reserved for reserve_ms, to be sent with its new stamp (stamp -1: given up, not sent).
local function hand_out(free, reserved, ending, reserve_ms)
  local now = now_ms()
  forget_left(now)
  local out = {}
  for _, ident in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now)) do
    if not reserved[ident] then
      local message = redis.call('HGET', KEYS[2], ident)
      if message and redis.call('HINCRBY', KEYS[9], '#' .. ident, 1) >= SENDS then
        -- Sent SENDS times and never claimed: given up (stamp -1), out of the room; a
        -- message of it that comes after all is a new call.
        redis.call('ZREM', KEYS[5], ident)
        redis.call('HDEL', KEYS[2], ident)
        redis.call('HDEL', KEYS[3], ident)
        redis.call('HDEL', KEYS[9], ident, '#' .. ident)
        table.insert(out, ident)
        table.insert(out, message)
        table.insert(out, -1)
      else
        put_back(ident)
      end
    end
  end
  if #free == 0 or redis.call('ZCARD', KEYS[1]) == 0 then
    prune(virtual_time())
    return out
  end
  local reserving = {}
  for ident, _ in pairs(reserved) do
    local name = redis.call('HGET', KEYS[3], ident)
    if name then reserving[name] = (reserving[name] or 0) + 1 end
  end
  local seen, from = {}, 0
  local vt = virtual_time()
  local f = 1
  while f <= #free do
    local best, at = lowest_with_room(from, seen, ending, reserving)
    from = at  -- (a served key's pass only grows: it moves past those ahead of it)
    if best == nil then break end
    local line = ARGV[1] .. best.tag
    local ident = redis.call('LPOP', line .. ':again') or redis.call('LPOP', line)
    local message = ident and redis.call('HGET', KEYS[2], ident)
    if message then
      redis.call('SET', KEYS[7] .. ':slot' .. free[f], 'f|' .. ident, 'PX', reserve_ms)
      redis.call('ZADD', KEYS[5], now + reserve_ms, ident)
      local stamp = redis.call('HINCRBY', KEYS[9], '', 1)
      redis.call('HSET', KEYS[9], ident, stamp)
      f = f + 1
      vt = math.max(vt, best.pass)
      best.pass = best.pass + 1 / best.weight
      best.room = best.room - 1
      table.insert(out, ident)
      table.insert(out, message)
      table.insert(out, stamp)
    elseif ident then
      redis.call('HDEL', KEYS[3], ident)  -- its message is gone: nothing to run
    end
    if redis.call('LLEN', line) + redis.call('LLEN', line .. ':again') == 0 then
      redis.call('ZREM', KEYS[1], best.name)
      redis.call('HSET', KEYS[6], best.name, string.format('%.17g', best.pass))
      best.room = 0
    else
      redis.call('ZADD', KEYS[1], best.pass, best.name)
    end
  end
  redis.call('HSET', KEYS[6], '', string.format('%.17g', vt))
  prune(vt)
  return out
end

-- A reserved call starts: its key's lowest free slot (within the cap) and its reserved
-- total slot become its running leases, and it leaves the room. nil: its key has no
-- slot free yet (a run ending releases its own after the total's). Its stamp is kept
-- keep_ms: a copy of it (another stamp) is dropped.
local function claim(ident, slot_n, info, token, ttl_ms, keep_ms)
  local own, free, held = nil, nil, 0
  for i = 1, info.widest do
    local v = redis.pcall('GET', info.tag .. ':slot' .. i)
    if v == token then own = i break
    elseif not v then free = free or i
    else held = held + 1 end
  end
  if own == nil then
    if info.cap > 0 and held >= info.cap then return nil end
    if free == nil then return nil end
    own = free
  end
  redis.call('SET', info.tag .. ':slot' .. own, token, 'PX', ttl_ms)
  local key_fence = new_fence(info.tag .. ':fence', ttl_ms)
  redis.call('SET', KEYS[7] .. ':slot' .. slot_n, token, 'PX', ttl_ms)
  local total_fence = new_fence(KEYS[7] .. ':fence', ttl_ms)
  leave(ident, keep_ms)
  return {key_fence, own, total_fence, slot_n}
end

-- The slot a running token of task_id holds, of the total's (total slots) or of the
-- key's ('tag\twidest\t...'): its tag, number and token; nil for none.
local function running_of(task_id, key, total)
  local suffix = '|' .. task_id
  local tag, widest = string.match(key, '^(.*)\t(%d+)\t%d+\t[^\t]+$')
  for _, of in ipairs({{KEYS[7], total}, {tag, tonumber(widest)}}) do
    for i = 1, of[2] do
      local v = redis.pcall('GET', of[1] .. ':slot' .. i)
      if type(v) == 'string' and string.sub(v, 1, 2) == 'x|'
          and string.sub(v, -#suffix) == suffix then
        return of[1], i, v
      end
    end
  end
  return nil
end
