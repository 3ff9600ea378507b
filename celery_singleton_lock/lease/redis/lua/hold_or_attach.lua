-- A canvas member's hold, or its attach to the call that holds its key, in one step: a
-- holder that ends meanwhile is never attached to (its release comes first, and the key
-- is then free: the call holds it).
-- KEYS[1] the hold's lock key  KEYS[2] the lock's attached calls (hash)  KEYS[3] the due index
-- KEYS[4] the lock's history
-- ARGV[1] token  ARGV[2] ttl in ms  ARGV[3] the call's task id  ARGV[4] its message (record)
-- ARGV[5] the lock's name (the due index's member)  ARGV[6] its history spec ('' for none)
-- returns {1, 0}             held (or held by this very token: a retry whose reply was lost)
--         {2, holder, pttl}  attached to `holder` (its token): the message is kept, not sent
--         {0, holder, pttl}  held by a value no call may attach to ('' when foreign): the
--                            message is sent without a hold, as before attach
--- @include "attach"
local step, current, pttl, holder = attach_step(ARGV[1], ARGV[3])
if step == 'hold' then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) end
if step == 'hold' or step == 'held' then return {1, 0} end
if step == 'send' then return {0, current, pttl} end
attach(2, 3, 4, ARGV[3], holder, ARGV[4], ARGV[5], ARGV[1], ARGV[2], ARGV[6])
return {2, current, pttl}
