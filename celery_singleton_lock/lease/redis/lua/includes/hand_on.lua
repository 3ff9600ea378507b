-- Pass the lock KEYS[1] to `token` for `ttl` ms, recording `record` in its replaced set
-- KEYS[2] for at least as long. Shared by swap.lua and swap_and_push.lua; not a script itself.
local function pass_to(token, ttl, record)
  redis.call('SET', KEYS[1], token, 'PX', ttl)
  redis.call('SADD', KEYS[2], record)
  if redis.call('PTTL', KEYS[2]) < tonumber(ttl) then
    redis.call('PEXPIRE', KEYS[2], ttl)
  end
end
