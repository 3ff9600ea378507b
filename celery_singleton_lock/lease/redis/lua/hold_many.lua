-- Holds for a batch of dispatches, each taken or refused in this one step: the holds of
-- a batch are decided in one round trip, not one per call. Unfenced, as a queued
-- message's hold is (acquire.lua with ARGV[7] '1' and nothing to take over).
--
-- KEYS[i] the hold (lock) key of call i (each key once: the caller folds duplicates)
-- ARGV[2i-1] call i's owner token  ARGV[2i] its ttl in milliseconds
-- returns one reply per call, in order, shaped as acquire.lua's:
--   {1, 0}              held; or held by this very token already (a retry whose reply
--                       was lost gets the answer the call itself got)
--   {0, holder, pttl}   held by `holder` ('' when foreign) for `pttl` more ms; not taken
local out = {}
for i = 1, #KEYS do
  local token = ARGV[2 * i - 1]
  if redis.call('SET', KEYS[i], token, 'NX', 'PX', ARGV[2 * i]) then
    out[i] = {1, 0}
  else
    local current = redis.pcall('GET', KEYS[i])
    if current == token then
      out[i] = {1, 0}
    else
      if type(current) ~= 'string' then current = '' end
      out[i] = {0, current, redis.call('PTTL', KEYS[i])}
    end
  end
end
return out
