-- A canvas member's hold and push, or its attach to the call that holds its key, in the
-- one step of the push (a broker's queue on the lock store's server): held and pushed;
-- attached, its message kept beside the lock and not pushed; or pushed without a hold.
-- KEYS[1] hold (lock) key  KEYS[2] the lock's attached calls  KEYS[3] the due index
-- KEYS[4] the list to push to  KEYS[5..9] the notes' keys  KEYS[10..] lists to expire too
-- ARGV[1..7] as hold_and_push.lua's  ARGV[8] the call's task id  ARGV[9] its message as
-- kept (record)  ARGV[10] the lock's name
-- returns {1, 0}             held and pushed (or held by this very token already)
--         {2, holder, pttl}  attached to `holder` (its token); nothing pushed
--         {0, holder, pttl}  held by a value no call attaches to; pushed without a hold
--- @include "push"
--- @include "attach"
local current = redis.pcall('GET', KEYS[1])
if not current then
  push(4, ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, 0}
end
if current == ARGV[1] then return {1, 0} end
if type(current) ~= 'string' then current = '' end
local pttl = redis.call('PTTL', KEYS[1])
local holder = attachable(current)
if holder == nil or holder == ARGV[8] then
  push(4, ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
  return {0, current, pttl}
end
attach(2, 3, ARGV[8], holder, ARGV[9], ARGV[10], ARGV[1], ARGV[2])
return {2, current, pttl}
