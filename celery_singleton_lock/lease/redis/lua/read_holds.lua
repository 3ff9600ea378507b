-- Read a batch of locks in one step (a single server; reading only).
-- KEYS[1..n] the locks' keys, then their fence keys   ARGV[i] the index in KEYS of key
-- i's fence key, or 0 for a hold that takes no fence
-- returns JSON: for each key [value, pttl, fence or false], or 0 for a key released
-- since or not a string. One string, not an array: a reply is parsed in Python (without
-- hiredis), a reply of 3,000 items costs far more than one JSON text.
local out = {}
for i = 1, #ARGV do
  local value = redis.pcall('GET', KEYS[i])
  if type(value) == 'string' then
    local fence = ARGV[i] ~= '0' and redis.call('GET', KEYS[tonumber(ARGV[i])]) or false
    -- Ours are ASCII; another's bytes must not break a client that decodes replies.
    out[i] = {string.gsub(value, '[\128-\255]', '?'), redis.call('PTTL', KEYS[i]), fence}
  else
    out[i] = 0
  end
end
return cjson.encode(out)
