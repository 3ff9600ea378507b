-- Forget attached calls answered or sent under this claim; the lock leaves the due index
-- once it has none.
-- KEYS[1] the lock's attached calls  KEYS[2] the due index
-- ARGV[1] the lock's name  ARGV[2] claim token  ARGV[3..] task ids
-- returns how many were forgotten
local done = 0
for i = 3, #ARGV do
  local raw = redis.call('HGET', KEYS[1], ARGV[i])
  if raw and cjson.decode(raw).c == ARGV[2] then
    redis.call('HDEL', KEYS[1], ARGV[i])
    done = done + 1
  end
end
if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('ZREM', KEYS[2], ARGV[1]) end
return done
