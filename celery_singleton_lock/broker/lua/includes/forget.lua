-- Drop a member's note (the notes' keys being KEYS[1..5]). Not a script itself.
local function forget(member)
  redis.call('ZREM', KEYS[1], member)
  redis.call('HDEL', KEYS[2], member)
  redis.call('HDEL', KEYS[3], member)
end
