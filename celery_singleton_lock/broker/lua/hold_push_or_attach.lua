-- A canvas member's hold and push, or its attach to the call that holds its key, in the
-- one step of the push (a broker's queue on the lock store's server): held and pushed;
-- attached, its message kept beside the lock and not pushed; or pushed without a hold.
-- KEYS[1] hold (lock) key  KEYS[2] the lock's attached calls  KEYS[3] the due index
-- KEYS[4] the lock's history  KEYS[5] the list to push to  KEYS[6..10] the notes' keys
-- KEYS[11..] lists to expire too
-- ARGV[1..7] as hold_and_push.lua's  ARGV[8] the call's task id  ARGV[9] its message as
-- kept (record)  ARGV[10] the lock's name  ARGV[11] its history spec ('' for none)
-- returns {1, 0}             held and pushed (or held by this very token already)
--         {2, holder, pttl}  attached to `holder` (its token); nothing pushed
--         {0, holder, pttl}  held by a value no call attaches to; pushed without a hold
--- @include "push"
--- @include "attach"
local step, current, pttl, holder = attach_step(ARGV[1], ARGV[8])
if step == 'held' then return {1, 0} end
if step == 'attach' then
  attach(2, 3, 4, ARGV[8], holder, ARGV[9], ARGV[10], ARGV[1], ARGV[2], ARGV[11])
  return {2, current, pttl}
end
push(5, ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
if step == 'hold' then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, 0}
end
return {0, current, pttl}
