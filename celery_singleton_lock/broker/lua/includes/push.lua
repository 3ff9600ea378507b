-- Push to KEYS[list] (in `list_db`, '' for the lock's; `lock_db` after), PEXPIRE each key
-- past the notes' (KEYS[list + 1 .. list + NOTE_KEYS]) by `expire_ms` ('' for none: a queue
-- that expires unused); with a `spec`, note the message in transit (includes/note.lua)
-- until its receipt clears it. Shared by the push scripts; not one itself.
--- @include "note"
local function push(list, payload, list_db, expire_ms, lock_db, spec)
  if list_db ~= '' then redis.call('SELECT', list_db) end
  redis.call('LPUSH', KEYS[list], payload)
  if expire_ms ~= '' then
    for i = list + NOTE_KEYS + 1, #KEYS do redis.call('PEXPIRE', KEYS[i], expire_ms) end
  end
  if spec ~= '' then note(list + 1, spec, KEYS[list], payload) end
  if list_db ~= '' then redis.call('SELECT', lock_db) end
end
