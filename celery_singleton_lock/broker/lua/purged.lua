-- The notes of the messages a purge emptied from their lists.
--
-- KEYS[1..5] the notes'  ARGV the lists a purge emptied: their messages' notes dropped.
-- returns {name, token} of each (their holds, for the caller to give up)
--- @include "forget"
local purged, holds, cursor = {}, {}, '0'
for _, list in ipairs(ARGV) do purged[list] = true end
repeat
  local page = redis.call('HSCAN', KEYS[2], cursor, 'COUNT', 500)
  cursor = page[1]
  for i = 1, #page[2], 2 do
    local r = cjson.decode(page[2][i + 1])
    if purged[r[3]] then
      table.insert(holds, {r[1], r[2]})
      forget(page[2][i])
    end
  end
until cursor == '0'
return holds
