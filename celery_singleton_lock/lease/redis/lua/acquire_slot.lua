-- A counting lease: the first free slot of several (names.slot), in one step.
-- KEYS[1] fence key    KEYS[2] waiters key   KEYS[3..] the slots' lock keys, in order
-- ARGV[1] owner token  ARGV[2] ttl in milliseconds
-- ARGV[3] '1' if the caller will block on the signal when this fails, else '0'
-- ARGV[4] optional: how many of the slots may be held at once (an operator lowered the
--         limit: slots above it are still looked at, so their runs count)
-- returns {1, fence, slot number}   the lowest free slot (or the caller's own again,
--                                   so a retry after a lost reply is safe)
--         {0, holder, pttl}          every slot held; the holder and ttl of the slot
--                                   that frees soonest (-1: a slot has no TTL)
-- Unlike acquire.lua it leaves a wake-up already in the list in place: another slot may be free for it.
local free, own, soonest, holder, held = nil, nil, nil, '', 0
for i = 3, #KEYS do
  local current = redis.pcall('GET', KEYS[i])
  if current == ARGV[1] then
    own = i
    break
  elseif current == false then
    if free == nil then free = i end
  else
    held = held + 1
    local pttl = redis.call('PTTL', KEYS[i])
    if soonest == nil or (pttl >= 0 and (soonest < 0 or pttl < soonest)) then
      soonest = pttl
      holder = type(current) == 'string' and current or ''
    end
  end
end
if own ~= nil then
  free = own
elseif ARGV[4] ~= nil and held >= tonumber(ARGV[4]) then
  free = nil  -- as many run as the limit in force allows
end
if free ~= nil then
  redis.call('SET', KEYS[free], ARGV[1], 'PX', ARGV[2])
  local now = redis.call('TIME')
  local fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local last = tonumber(redis.pcall('GET', KEYS[1]))
  if last ~= nil and last >= fence then fence = last + 1 end
  local keep = math.max(tonumber(ARGV[2]), redis.call('PTTL', KEYS[1]))
  redis.call('SET', KEYS[1], string.format('%.0f', fence), 'PX', keep)
  return {1, fence, free - 2}
end
if ARGV[3] == '1' then
  local keep = (soonest ~= nil and soonest > 0 and soonest or 1000) + 1000
  if redis.call('PTTL', KEYS[2]) < keep then
    redis.call('SET', KEYS[2], '1', 'PX', keep)
  end
end
return {0, holder, soonest or -1}
